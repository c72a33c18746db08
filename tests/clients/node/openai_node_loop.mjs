// A tool loop with the `openai` npm package, streamed, written the way users write it: the deltas
// are accumulated into content and tool_calls, and the assistant turn goes back as
// {role, content, tool_calls} (whatever else the stream carried is not kept).
//
// Environment: TOOLSHIM_BASE_URL, TOOLSHIM_MODEL, OPENAI_API_KEY.
// Prints "TOOL <name> <arguments> -> <output>" per tool run and "FINAL: <text>" at the end;
// on an API error prints "ERROR: <status> <message>" and exits 1.
import OpenAI from "openai";
import { runTool, TOOLS_CHAT, prompt } from "./common.mjs";

const client = new OpenAI({
  baseURL: process.env.TOOLSHIM_BASE_URL,
  apiKey: process.env.OPENAI_API_KEY,
  maxRetries: 0,
  timeout: 30_000,
});
const model = process.env.TOOLSHIM_MODEL;

const messages = [
  { role: "system", content: "You are a careful assistant. Use the tools to run checks." },
  { role: "user", content: prompt(model) },
];

async function main() {
  for (let step = 0; step < 6; step++) {
    const stream = await client.chat.completions.create({
      model,
      messages,
      tools: TOOLS_CHAT,
      stream: true,
      stream_options: { include_usage: true },
    });
    let content = "";
    const calls = [];
    for await (const chunk of stream) {
      const delta = chunk.choices[0]?.delta;
      if (!delta) continue;
      if (delta.content) content += delta.content;
      for (const part of delta.tool_calls ?? []) {
        calls[part.index] ??= { id: "", type: "function", function: { name: "", arguments: "" } };
        const call = calls[part.index];
        if (part.id) call.id = part.id;
        if (part.function?.name) call.function.name += part.function.name;
        if (part.function?.arguments) call.function.arguments += part.function.arguments;
      }
    }
    if (calls.length === 0) {
      console.log(`FINAL: ${content}`);
      return;
    }
    messages.push({ role: "assistant", content: content || null, tool_calls: calls });
    for (const call of calls) {
      const output = runTool(call.function.name, JSON.parse(call.function.arguments));
      messages.push({ role: "tool", tool_call_id: call.id, content: output });
    }
  }
  throw new Error("no final answer after 6 steps");
}

main().catch((err) => {
  console.error(`ERROR: ${err.status ?? ""} ${err.message}`);
  process.exit(1);
});
