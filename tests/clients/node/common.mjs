// What the node clients share: the tools they declare and run, and the prompt.
import { execFileSync } from "node:child_process";

export const SHELL_DESCRIPTION = "Run a shell command and return what it printed.";
export const READ_DESCRIPTION = "Read a text file.";

// Chat Completions tool definitions (openai-node).
export const TOOLS_CHAT = [
  {
    type: "function",
    function: {
      name: "run_shell",
      description: SHELL_DESCRIPTION,
      parameters: {
        type: "object",
        properties: { command: { type: "string", description: "The command line." } },
        required: ["command"],
      },
    },
  },
  {
    type: "function",
    function: {
      name: "read_file",
      description: READ_DESCRIPTION,
      parameters: {
        type: "object",
        properties: { path: { type: "string" } },
        required: ["path"],
      },
    },
  },
];

// The first user message, unique per test (the model name is), so no two tests share a
// conversation in toolshim's memory.
export function prompt(model) {
  return `Run the two checks for ${model}, then tell me what they printed.`;
}

export function runShell(command) {
  const output = execFileSync("bash", ["-c", command], { encoding: "utf8", timeout: 10_000 });
  return output;
}

export function runTool(name, args) {
  let output;
  if (name === "run_shell") output = runShell(args.command);
  else if (name === "read_file") output = `(no file ${args.path})`;
  else output = `unknown tool ${name}`;
  console.log(`TOOL ${name} ${JSON.stringify(args)} -> ${output.trim()}`);
  return output;
}

// Anthropic Messages tool definitions (@anthropic-ai/sdk).
export const TOOLS_ANTHROPIC = [
  {
    name: "run_shell",
    description: SHELL_DESCRIPTION,
    input_schema: {
      type: "object",
      properties: { command: { type: "string", description: "The command line." } },
      required: ["command"],
    },
  },
  {
    name: "read_file",
    description: READ_DESCRIPTION,
    input_schema: { type: "object", properties: { path: { type: "string" } }, required: ["path"] },
  },
];

// The first user message of the Anthropic loops (one check), unique per test as prompt() is.
export function anthropicPrompt(model) {
  return `Run the check for ${model}, then tell me what it printed.`;
}

// One line per message the client got: its stop_reason and content blocks, as JSON.
export function reportMessage(message) {
  console.log(`MESSAGE ${JSON.stringify({ stop_reason: message.stop_reason, content: message.content })}`);
}
