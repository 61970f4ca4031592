/** Activation and deactivation only: everything else lives in its own module. */
import * as vscode from "vscode";
import { ErrorReporter, createLog } from "./logging";
import { REWRITE_SELECTION, rewriteSelection } from "./rewrite";
import { ServerManager } from "./server";
import { SHOW_LOG, StatusBar } from "./statusBar";

let manager: ServerManager | undefined;

export async function activate(context: vscode.ExtensionContext): Promise<void> {
  const log = createLog();
  const errors = new ErrorReporter(log);
  const statusBar = new StatusBar();
  manager = new ServerManager(log, errors, statusBar);
  const server = manager;
  context.subscriptions.push(
    log,
    statusBar,
    server,
    vscode.commands.registerCommand("diffill.restart", () => server.restart()),
    vscode.commands.registerCommand(SHOW_LOG, () => {
      log.show(true);
    }),
    vscode.commands.registerCommand(REWRITE_SELECTION, () => rewriteSelection(server, errors)),
  );
  await server.start();
}

export async function deactivate(): Promise<void> {
  await manager?.stop();
  manager = undefined;
}
