import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { formatMs, stateView, statusView } from "../src/statusFormat";

describe("statusView", () => {
  it("shows the model, the latency and tokens per forward pass", () => {
    const view = statusView({
      method: "textDocument/inlineCompletion",
      outcome: "ok",
      items: 2,
      cache_hit: false,
      ms: 41.2,
      model_ms: 35,
      forward_passes: 9,
      tokens_per_forward: 2.333,
      model: "diffill:model",
      state: "ready",
    });
    assert.equal(view.text, "$(sparkle) diffill:model · 41 ms · 2.3 tok/fwd");
    assert.match(view.tooltip, /2 suggestions/);
    assert.match(view.tooltip, /9 forward passes/);
    assert.match(view.tooltip, /open the diffill log/);
    assert.equal(view.warning, false);
  });

  it("says a cache hit instead of tokens per forward", () => {
    const view = statusView({ outcome: "cache", cache_hit: true, ms: 0.2, tokens_per_forward: 0, model: "m", state: "ready" });
    assert.equal(view.text, "$(sparkle) m · 0 ms · cached");
  });

  it("shows loading while the model is not ready", () => {
    const view = statusView({ outcome: "not_ready", ms: 1, model: "m", state: "loading" });
    assert.equal(view.text, "$(loading~spin) diffill");
  });

  it("warns when the model failed to load", () => {
    assert.equal(statusView({ outcome: "not_ready", state: "failed" }).warning, true);
  });

  it("copes with a payload that lacks fields", () => {
    assert.equal(statusView({}).text, "$(sparkle) diffill");
  });
});

describe("stateView", () => {
  it("names the model when it is ready and the reason when it is not", () => {
    assert.equal(stateView("ready", "diffill:tiny").text, "$(sparkle) diffill:tiny");
    assert.match(stateView("failed", undefined, "no such directory").tooltip, /no such directory/);
    const lost = stateView("unreachable");
    assert.match(lost.tooltip, /not answering/);
    assert.equal(lost.warning, true);
  });
});

describe("formatMs", () => {
  it("uses ms below a second and seconds above", () => {
    assert.equal(formatMs(41.6), "42 ms");
    assert.equal(formatMs(1234), "1.2 s");
  });
});
