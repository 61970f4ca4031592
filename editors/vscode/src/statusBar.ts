/** The status bar item: the model, the last request's latency and tokens per forward pass; a click opens the log. */
import * as vscode from "vscode";
import { type StatusPayload, type StatusView, stateView, statusView } from "./statusFormat";

export const SHOW_LOG = "diffill.showLog";

export class StatusBar implements vscode.Disposable {
  private readonly item = vscode.window.createStatusBarItem("diffill.status", vscode.StatusBarAlignment.Right, 100);

  constructor() {
    this.item.name = "diffill";
    this.item.command = SHOW_LOG;
    this.show(stateView("starting"));
    this.item.show();
  }

  /** After a `diffill/status` notification. */
  update(payload: StatusPayload): void {
    this.show(statusView(payload));
  }

  /** When the server's state is known without a request (started, stopped, model loaded). */
  state(state: string, model?: string, message?: string): void {
    this.show(stateView(state, model, message));
  }

  private show(view: StatusView): void {
    this.item.text = view.text;
    this.item.tooltip = view.tooltip;
    this.item.backgroundColor = view.warning ? new vscode.ThemeColor("statusBarItem.warningBackground") : undefined;
  }

  dispose(): void {
    this.item.dispose();
  }
}
