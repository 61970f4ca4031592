// Drives VS Code (code-server, with the packaged diffill .vsix installed) in Debian's headless Chromium with
// playwright-core, as a user would: open greet.py, type inside its docstring, wait for the server's ghost text,
// accept it with Tab, save; select two lines, run "diffill: Rewrite selection", save; undo. Documents are read
// back from disk after each save. Writes a JSON outcome (and screenshots) for tests/editors/test_vscode.py.
//
// usage: node drive.mjs URL WORKSPACE_FILE OUT_JSON ARTIFACTS_DIR
import { readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { join } from "node:path";

const require = createRequire(import.meta.url);
const { chromium } = require(process.env.PLAYWRIGHT_CORE ?? "playwright-core");

const [url, file, outPath, artifacts] = process.argv.slice(2);
const WAIT = 90_000; // a single wait (the machine may be busy)
const results = {};
const steps = [];

function step(name) {
  steps.push(`${new Date().toISOString()} ${name}`);
}

async function command(page, name) {
  await page.keyboard.press("F1");
  const input = page.locator(".quick-input-widget input");
  await input.waitFor({ state: "visible", timeout: WAIT });
  await input.fill(`>${name}`);
  await page.locator(".quick-input-list .monaco-list-row").first().waitFor({ timeout: WAIT });
  await page.waitForTimeout(300);
  await page.keyboard.press("Enter");
}

async function goToLine(page, line) {
  await page.keyboard.press("Control+G");
  const input = page.locator(".quick-input-widget input");
  await input.waitFor({ state: "visible", timeout: WAIT });
  await input.fill(`:${line}`);
  await page.keyboard.press("Enter");
  await page.waitForTimeout(300);
}

async function save(page) {
  await page.keyboard.press("Control+S");
  await page.waitForFunction(() => !document.querySelector(".tab.dirty"), null, { timeout: WAIT });
  await page.waitForTimeout(300);
  return readFileSync(file, "utf8");
}

async function statusText(page) {
  return (await page.locator(".statusbar").innerText()).replace(/\s+/g, " ");
}

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"],
});
let failure;
const page = await browser.newPage({ viewport: { width: 1280, height: 720 } });
try {
  step("open the workbench");
  await page.goto(url, { waitUntil: "domcontentloaded", timeout: WAIT });
  await page.locator(".monaco-workbench").waitFor({ timeout: WAIT });
  await page.locator(".statusbar").waitFor({ timeout: WAIT });

  step("open greet.py");
  await page.keyboard.press("Control+P");
  const quick = page.locator(".quick-input-widget input");
  await quick.waitFor({ state: "visible", timeout: WAIT });
  await quick.fill("greet.py");
  await page.locator(".quick-input-list .monaco-list-row").first().waitFor({ timeout: WAIT });
  await page.keyboard.press("Enter");
  await page.locator(".monaco-editor .view-lines").first().waitFor({ timeout: WAIT });
  await page.locator(".monaco-editor .view-lines").first().click();

  step("wait until the model is ready (status bar)");
  await page.waitForFunction(() => /diffill:[^\s]/.test(document.querySelector(".statusbar")?.textContent ?? ""), null,
                             { timeout: WAIT });
  results.status_ready = await statusText(page);

  step("type in the docstring and wait for ghost text");
  const ghost = page.locator(".ghost-text-decoration, .ghost-text");
  await goToLine(page, 4);
  await page.keyboard.press("End");
  await page.keyboard.type(" It", { delay: 60 });
  // The language client may start after the file opened: retry the trigger until ghost text shows.
  for (let attempt = 0; attempt < 10 && !(await ghost.count()); attempt++) {
    try {
      await ghost.first().waitFor({ timeout: 6000 });
    } catch {
      step(`no ghost text yet (attempt ${attempt + 1}): trigger it again`);
      await command(page, "Trigger Inline Suggestion");
    }
  }
  await ghost.first().waitFor({ timeout: WAIT });
  results.ghost_text = (await ghost.allInnerTexts()).join("\n");
  await page.screenshot({ path: join(artifacts, "vscode-ghost-text.png") });

  step("accept with Tab and save");
  await page.keyboard.press("Tab");
  await page.waitForTimeout(500);
  results.ghost_after_tab = await ghost.count();
  results.after_accept = await save(page);
  results.status_after_request = await statusText(page);

  step("select lines 4-5 and run Rewrite selection");
  results.before_rewrite = results.after_accept;
  const lines = results.before_rewrite.split("\n");
  const target = lines.findIndex((line) => line.includes("It ends with a newline.")) + 1;
  results.rewrite_first_line = target - 2; // 0-based index of the first selected line
  await goToLine(page, target - 1);
  await page.keyboard.press("Home");
  await page.keyboard.press("Home");
  await page.keyboard.press("Shift+ArrowDown");
  await page.keyboard.press("Shift+ArrowDown");
  await command(page, "diffill: Rewrite selection");
  const prompt = page.locator(".quick-input-widget", { hasText: "How to change the selection" });
  await prompt.waitFor({ state: "visible", timeout: WAIT });
  results.instruction_prompt = await prompt.innerText();
  await page.keyboard.press("Enter"); // no instruction: a plain rewrite
  await page.locator(".tab.dirty").first().waitFor({ timeout: WAIT });
  results.after_rewrite = await save(page);
  await page.screenshot({ path: join(artifacts, "vscode-rewrite.png") });

  step("undo once");
  await page.keyboard.press("Control+Z");
  await page.waitForTimeout(500);
  results.after_undo = await save(page);

  step("click the status bar item: the log opens");
  await page.locator(".statusbar-item", { hasText: "diffill:tiny" }).first().click();
  const panel = page.locator(".part.panel");
  await panel.waitFor({ state: "visible", timeout: WAIT });
  await page.waitForFunction(() => document.querySelector(".part.panel")?.textContent?.includes("starting"), null,
                             { timeout: WAIT });
  results.log_panel = (await panel.innerText()).slice(0, 2000);
  step("done");
} catch (error) {
  failure = String(error?.stack ?? error);
  try {
    await page.screenshot({ path: join(artifacts, "vscode-failure.png") });
    results.status_at_failure = await statusText(page);
  } catch {
    // the page is gone
  }
} finally {
  await browser.close();
}
writeFileSync(outPath, JSON.stringify({ ok: failure === undefined, error: failure, results, steps }, null, 2));
