/** Starts, stops and restarts the language client for `diffill serve`, and routes what the server tells us. */
import * as vscode from "vscode";
import {
  type ApplyWorkspaceEditParams,
  type ApplyWorkspaceEditResult,
  CancellationToken,
  type LanguageClientOptions,
  LanguageClient,
  RevealOutputChannelOn,
  type ServerOptions,
  State,
} from "vscode-languageclient/node";
import { serverLaunch } from "./config";
import type { ErrorReporter } from "./logging";
import { SECTION, changesLaunch, changesServerSettings, launchSettings, previewRewrite, serverSettings } from "./settings";
import type { StatusBar } from "./statusBar";
import type { StatusPayload } from "./statusFormat";

const STATUS = "diffill/status";
const DEBUG_INFO = "diffill/debugInfo";
const LOAD_POLL_MS = 500;

interface DebugInfo {
  state?: string;
  model?: string;
  message?: string;
}

/** Owns the language client; `client` is undefined while the server is not running. */
export class ServerManager implements vscode.Disposable {
  private current: LanguageClient | undefined;
  private starting: Promise<void> | undefined;
  private generation = 0; // bumped at every (re)start, so a stale model-load poll stops
  private readonly disposables: vscode.Disposable[] = [];

  constructor(
    private readonly log: vscode.LogOutputChannel,
    private readonly errors: ErrorReporter,
    private readonly statusBar: StatusBar,
  ) {
    this.disposables.push(vscode.workspace.onDidChangeConfiguration((event) => void this.configurationChanged(event)));
  }

  /** The running client, if any. */
  get client(): LanguageClient | undefined {
    return this.current?.state === State.Running ? this.current : undefined;
  }

  /** Start the server (a no-op while it runs or starts). */
  async start(): Promise<void> {
    if (this.current !== undefined) {
      return this.starting;
    }
    this.starting = this.doStart();
    return this.starting;
  }

  /** Stop the server and start it again with the current settings. */
  async restart(): Promise<void> {
    this.log.info("restarting the server");
    await this.stop();
    await this.start();
  }

  /** Stop the server. */
  async stop(): Promise<void> {
    const client = this.current;
    this.current = undefined;
    this.starting = undefined;
    this.generation += 1;
    if (client === undefined) {
      return;
    }
    try {
      await client.stop(2000);
    } catch (error) {
      this.log.warn(`stopping the server: ${String(error)}`);
    }
    await client.dispose();
    this.statusBar.state("stopped");
  }

  private async doStart(): Promise<void> {
    const generation = ++this.generation;
    let launch;
    try {
      launch = serverLaunch(launchSettings());
    } catch (error) {
      this.errors.report("cannot start the server", error);
      this.statusBar.state("stopped");
      return;
    }
    this.log.info(`starting ${[launch.command, ...launch.args].join(" ")}`);
    // No `transport`: stdio without the `--stdio` flag that TransportKind.stdio would append.
    const serverOptions: ServerOptions = { command: launch.command, args: launch.args };
    const client = new LanguageClient(SECTION, "diffill", serverOptions, this.clientOptions());
    this.current = client;
    this.statusBar.state("starting");
    client.onNotification(STATUS, (payload: StatusPayload) => {
      this.statusBar.update(payload);
    });
    try {
      await client.start();
    } catch (error) {
      if (this.current === client) {
        this.current = undefined;
      }
      this.errors.report(`could not start '${launch.command}' (set diffill.server.command or diffill.server.pythonPath)`, error);
      this.statusBar.state("stopped");
      return;
    }
    void this.watchModelLoad(client, generation);
  }

  private clientOptions(): LanguageClientOptions {
    return {
      documentSelector: [{ scheme: "file" }, { scheme: "untitled" }],
      initializationOptions: () => serverSettings(),
      outputChannel: this.log,
      revealOutputChannelOn: RevealOutputChannelOn.Never, // errors are shown once by ErrorReporter
      middleware: {
        workspace: {
          // The server asks with workspace/configuration when it got no initializationOptions.
          configuration: (params, token, next) => {
            if (params.items.every((item) => item.section === SECTION)) {
              return params.items.map((item) =>
                serverSettings(item.scopeUri !== undefined ? vscode.Uri.parse(item.scopeUri) : undefined),
              );
            }
            return next(params, token);
          },
          handleApplyEdit: (params, next) =>
            previewRewrite() ? this.applyWithPreview(params) : next(params, CancellationToken.None),
        },
      },
    };
  }

  /** Apply the server's edit through the Refactor Preview, where the user confirms it. */
  private async applyWithPreview(params: ApplyWorkspaceEditParams): Promise<ApplyWorkspaceEditResult> {
    const client = this.current;
    if (client === undefined) {
      return { applied: false, failureReason: "the client stopped" };
    }
    const converted = await client.protocol2CodeConverter.asWorkspaceEdit(params.edit);
    const edit = new vscode.WorkspaceEdit();
    const metadata: vscode.WorkspaceEditEntryMetadata = { needsConfirmation: true, label: params.label ?? "diffill" };
    for (const [uri, edits] of converted.entries()) {
      for (const change of edits) {
        edit.replace(uri, change.range, change.newText, metadata);
      }
    }
    return { applied: await vscode.workspace.applyEdit(edit, { isRefactoring: true }) };
  }

  /** Show in the status bar when the model has loaded (the server answers at once and loads in the background). */
  private async watchModelLoad(client: LanguageClient, generation: number): Promise<void> {
    while (generation === this.generation && client.state === State.Running) {
      let info: DebugInfo;
      try {
        info = await client.sendRequest<DebugInfo>(DEBUG_INFO, {});
      } catch (error) {
        this.log.debug(`${DEBUG_INFO}: ${String(error)}`);
        return;
      }
      const state = info.state ?? "ready";
      if (state !== "starting" && state !== "loading") {
        if (generation === this.generation) {
          this.statusBar.state(state, info.model, info.message);
        }
        return;
      }
      this.statusBar.state(state);
      await new Promise((resolve) => setTimeout(resolve, LOAD_POLL_MS));
    }
  }

  private async configurationChanged(event: vscode.ConfigurationChangeEvent): Promise<void> {
    if (changesLaunch(event)) {
      await this.restart();
      return;
    }
    const client = this.client;
    if (client !== undefined && changesServerSettings(event)) {
      this.log.info("sending the changed settings to the server");
      await client.sendNotification("workspace/didChangeConfiguration", { settings: { [SECTION]: serverSettings() } });
      void this.watchModelLoad(client, this.generation);
    }
  }

  dispose(): void {
    for (const disposable of this.disposables) {
      disposable.dispose();
    }
    void this.stop();
  }
}
