// The Vercel AI SDK (`ai` with `@ai-sdk/openai-compatible`): tools with `execute`, and a step limit,
// so the SDK runs the loop itself. TOOLSHIM_MODE=stream uses streamText (the default),
// TOOLSHIM_MODE=generate uses generateText.
//
// Environment: TOOLSHIM_BASE_URL, TOOLSHIM_MODEL, OPENAI_API_KEY, TOOLSHIM_MODE.
// Prints "TOOL <name> <arguments> -> <output>" per tool run and "FINAL: <text>" at the end;
// on an API error prints "ERROR: <status> <message> <response body>" and exits 1.
import { createOpenAICompatible } from "@ai-sdk/openai-compatible";
import { generateText, stepCountIs, streamText, tool } from "ai";
import { z } from "zod";
import { READ_DESCRIPTION, SHELL_DESCRIPTION, prompt, runTool } from "./common.mjs";

const provider = createOpenAICompatible({
  name: "toolshim-test",
  baseURL: process.env.TOOLSHIM_BASE_URL,
  apiKey: process.env.OPENAI_API_KEY,
  includeUsage: true,
});
const model = process.env.TOOLSHIM_MODEL;

const tools = {
  run_shell: tool({
    description: SHELL_DESCRIPTION,
    inputSchema: z.object({ command: z.string().describe("The command line.") }),
    execute: async (args) => runTool("run_shell", args),
  }),
  read_file: tool({
    description: READ_DESCRIPTION,
    inputSchema: z.object({ path: z.string() }),
    execute: async (args) => runTool("read_file", args),
  }),
};

const request = {
  model: provider(model),
  system: "You are a careful assistant. Use the tools to run checks.",
  prompt: prompt(model),
  tools,
  stopWhen: stepCountIs(6),
  maxRetries: 0,
};

function describe(error) {
  const status = error?.statusCode ?? "";
  const body = error?.responseBody ?? "";
  return `${status} ${error?.message ?? error} ${body}`;
}

async function main() {
  if (process.env.TOOLSHIM_MODE === "generate") {
    const result = await generateText(request);
    console.log(`STEPS: ${result.steps.length}`);
    console.log(`FINAL: ${result.text}`);
    return;
  }
  const result = streamText({ ...request, onError: () => {} });
  let text = "";
  let steps = 0;
  for await (const part of result.fullStream) {
    if (part.type === "error") throw part.error;
    if (part.type === "start-step") text = "";
    if (part.type === "finish-step") steps += 1;
    if (part.type === "text-delta") text += part.text;
  }
  console.log(`STEPS: ${steps}`);
  console.log(`FINAL: ${text}`);
}

main().catch((err) => {
  console.error(`ERROR: ${describe(err)}`);
  process.exit(1);
});
