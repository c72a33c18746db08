// A tool loop with the TypeScript SDK (`@anthropic-ai/sdk`), as its docs write it: each turn is a
// `client.messages.stream(...)` read to `finalMessage()`; the tool_use blocks are run and the
// assistant's content goes back as it came, followed by a user message of tool_result blocks.
//
// Environment: TOOLSHIM_BASE_URL (the proxy, no /v1), TOOLSHIM_MODEL, ANTHROPIC_API_KEY.
// Prints "MESSAGE <json>" per message received, "TOOL <name> <arguments> -> <output>" per tool
// run and "FINAL: <text>" at the end (newlines as spaces); on an API error prints
// "ERROR: <status> <message>" and exits 1.
import Anthropic from "@anthropic-ai/sdk";
import { TOOLS_ANTHROPIC, anthropicPrompt, reportMessage, runTool } from "./common.mjs";

const client = new Anthropic({
  baseURL: process.env.TOOLSHIM_BASE_URL,
  apiKey: process.env.ANTHROPIC_API_KEY,
  maxRetries: 0,
  timeout: 30_000,
});
const model = process.env.TOOLSHIM_MODEL;

const messages = [{ role: "user", content: anthropicPrompt(model) }];

async function main() {
  for (let step = 0; step < 6; step++) {
    const stream = client.messages.stream({
      model,
      max_tokens: 1024,
      system: "You are a careful assistant. Use the tools to run checks.",
      messages,
      tools: TOOLS_ANTHROPIC,
    });
    const message = await stream.finalMessage();
    reportMessage(message);
    const calls = message.content.filter((block) => block.type === "tool_use");
    if (calls.length === 0) {
      const text = message.content.filter((block) => block.type === "text").map((block) => block.text).join("");
      console.log(`FINAL: ${text.replace(/\n/g, " ")}`);
      return;
    }
    messages.push({ role: "assistant", content: message.content });
    messages.push({
      role: "user",
      content: calls.map((call) => ({ type: "tool_result", tool_use_id: call.id, content: runTool(call.name, call.input) })),
    });
  }
  throw new Error("no final answer after 6 steps");
}

main().catch((err) => {
  console.error(`ERROR: ${err.status ?? ""} ${err.message}`);
  process.exit(1);
});
