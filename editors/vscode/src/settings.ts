/** Reads the `diffill.*` settings: the server's (sent as initializationOptions and on change) and the launch ones. */
import * as vscode from "vscode";
import { type Json, type LaunchSettings, SERVER_SETTINGS, nestSettings } from "./config";

export const SECTION = "diffill";

/** The server's settings the user set (user, workspace or folder), nested as the server reads them. */
export function serverSettings(scope?: vscode.ConfigurationScope): Record<string, Json> {
  const config = vscode.workspace.getConfiguration(SECTION, scope);
  return nestSettings(
    SERVER_SETTINGS.map((key) => {
      const seen = config.inspect<Json>(key);
      const value = seen?.workspaceFolderValue ?? seen?.workspaceValue ?? seen?.globalValue;
      return [key, value] as const;
    }),
  );
}

/** How to start the server. */
export function launchSettings(): LaunchSettings {
  const config = vscode.workspace.getConfiguration(SECTION);
  return {
    command: config.get<string[]>("server.command", ["diffill", "serve"]),
    pythonPath: config.get<string>("server.pythonPath", ""),
    args: config.get<string[]>("server.args", []),
  };
}

/** Whether the rewrite should be previewed before it is applied. */
export function previewRewrite(): boolean {
  return vscode.workspace.getConfiguration(SECTION).get<boolean>("ui.previewRewrite", false);
}

/** Whether a configuration change needs the server restarted (its command changed). */
export function changesLaunch(event: vscode.ConfigurationChangeEvent): boolean {
  return event.affectsConfiguration(`${SECTION}.server`);
}

/** Whether a configuration change concerns the server's own settings. */
export function changesServerSettings(event: vscode.ConfigurationChangeEvent): boolean {
  return SERVER_SETTINGS.some((key) => event.affectsConfiguration(`${SECTION}.${key}`));
}
