/** The extension's log (an output channel the language client shares) and how errors reach the user. */
import * as vscode from "vscode";

/** The "diffill" log output channel. */
export function createLog(): vscode.LogOutputChannel {
  return vscode.window.createOutputChannel("diffill", { log: true });
}

/** Whether an error only says that an operation was cancelled (never shown to the user). */
export function isCanceled(error: unknown): boolean {
  return (
    error instanceof vscode.CancellationError ||
    (error instanceof Error && (error.name === "Canceled" || error.message === "Canceled")) ||
    (typeof error === "object" && error !== null && "code" in error && error.code === -32800) // RequestCancelled
  );
}

/** Reports errors: always logged, shown to the user once per distinct message, cancellations silent. */
export class ErrorReporter {
  private readonly shown = new Set<string>();

  constructor(private readonly log: vscode.LogOutputChannel) {}

  report(what: string, error: unknown): void {
    if (isCanceled(error)) {
      this.log.debug(`${what}: cancelled`);
      return;
    }
    const message = `${what}: ${error instanceof Error ? error.message : String(error)}`;
    this.log.error(message);
    if (this.shown.has(message)) {
      return;
    }
    this.shown.add(message);
    void vscode.window.showErrorMessage(`diffill: ${message}`, "Show log").then((choice) => {
      if (choice !== undefined) {
        this.log.show(true);
      }
    });
  }
}
