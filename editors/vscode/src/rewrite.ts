/** "Rewrite selection": asks for an optional instruction and has the server rewrite the selected range. */
import * as vscode from "vscode";
import { ExecuteCommandRequest } from "vscode-languageclient/node";
import type { ErrorReporter } from "./logging";
import type { ServerManager } from "./server";

export const REWRITE_SELECTION = "diffill.rewriteSelection";
const SERVER_COMMAND = "diffill.rewrite"; // arguments: uri, range, optional instruction

/**
 * The server computes the edit against the document version it saw and sends it back with `workspace/applyEdit`,
 * which the language client applies as one workspace edit: one step of undo. A result computed for an older
 * version is refused by the server and by the client.
 */
export async function rewriteSelection(manager: ServerManager, errors: ErrorReporter): Promise<void> {
  const editor = vscode.window.activeTextEditor;
  if (editor === undefined || editor.selection.isEmpty) {
    void vscode.window.showInformationMessage("diffill: select the code to rewrite first.");
    return;
  }
  const client = manager.client;
  if (client === undefined) {
    void vscode.window.showWarningMessage("diffill: the server is not running (diffill: Restart server).");
    return;
  }
  const instruction = await vscode.window.showInputBox({
    title: "diffill: Rewrite selection",
    prompt: "How to change the selection (optional; press Enter to just rewrite it)",
    placeHolder: "e.g. use a list comprehension",
  });
  if (instruction === undefined) {
    return; // Escape
  }
  const range = client.code2ProtocolConverter.asRange(editor.selection);
  const args: unknown[] = [editor.document.uri.toString(), range];
  if (instruction.trim() !== "") {
    args.push(instruction.trim());
  }
  try {
    await vscode.window.withProgress(
      { location: vscode.ProgressLocation.Window, title: "diffill: rewriting", cancellable: false },
      (_progress, token) => client.sendRequest(ExecuteCommandRequest.type, { command: SERVER_COMMAND, arguments: args }, token),
    );
  } catch (error) {
    errors.report("rewrite failed", error);
  }
}
