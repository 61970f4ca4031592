import assert from "node:assert/strict";
import { describe, it } from "node:test";
import manifest from "../package.json";
import { SERVER_SETTINGS, nestSettings, serverLaunch } from "../src/config";

describe("SERVER_SETTINGS", () => {
  it("lists the server's settings and none of the extension's own", () => {
    assert.ok(SERVER_SETTINGS.includes("model.path"));
    assert.ok(SERVER_SETTINGS.includes("model.trustRemoteCode"));
    assert.ok(SERVER_SETTINGS.includes("completion.debounceMs"));
    assert.ok(SERVER_SETTINGS.includes("languages"));
    for (const key of SERVER_SETTINGS) {
      assert.ok(!/^(server|ui|trace)\./.test(key), key);
    }
  });

  it("covers every contributed setting once, client or server", () => {
    const contributed = Object.keys(manifest.contributes.configuration.properties);
    const clientOnly = contributed.filter((key) => /^diffill\.(server|ui|trace)\./.test(key));
    assert.equal(SERVER_SETTINGS.length + clientOnly.length, contributed.length);
  });
});

describe("nestSettings", () => {
  it("nests dotted keys into the objects the server reads", () => {
    const nested = nestSettings([
      ["model.path", "/models/tiny"],
      ["model.trustRemoteCode", true],
      ["completion.maxTokens", 32],
      ["languages", ["python"]],
    ]);
    assert.deepEqual(nested, {
      model: { path: "/models/tiny", trustRemoteCode: true },
      completion: { maxTokens: 32 },
      languages: ["python"],
    });
  });

  it("leaves out what the user did not set, so the server's defaults apply", () => {
    assert.deepEqual(nestSettings([["model.path", undefined], ["sampling.steps", undefined]]), {});
  });

  it("keeps an explicit null (the embedded model, the family's own steps)", () => {
    assert.deepEqual(nestSettings([["model.path", null]]), { model: { path: null } });
  });
});

describe("serverLaunch", () => {
  it("runs the configured command with its arguments and the extra ones", () => {
    assert.deepEqual(serverLaunch({ command: ["diffill", "serve"], pythonPath: "", args: ["-v"] }), {
      command: "diffill",
      args: ["serve", "-v"],
    });
  });

  it("prefers a Python interpreter when one is set", () => {
    assert.deepEqual(serverLaunch({ command: ["diffill", "serve"], pythonPath: " /venv/bin/python ", args: [] }), {
      command: "/venv/bin/python",
      args: ["-m", "diffill", "serve"],
    });
  });

  it("says which setting to fix when there is nothing to run", () => {
    assert.throws(() => serverLaunch({ command: [" "], pythonPath: "", args: [] }), /diffill\.server\.command/);
  });
});
