// Screenshot of ghost text in VS Code (code-server) for the README: open the demo file, type at the end of a line,
// wait for the server's ghost text, save a PNG.
//
// usage: node screenshot.mjs URL FILE_NAME LINE TYPED EXPECTED OUT_PNG
import { createRequire } from "node:module";

const require = createRequire(import.meta.url);
const { chromium } = require(process.env.PLAYWRIGHT_CORE ?? "playwright-core");
const [url, fileName, line, typed, expected, out] = process.argv.slice(2);
const WAIT = 90_000;

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"],
});
try {
  const page = await browser.newPage({ viewport: { width: 1100, height: 520 } });
  await page.goto(url, { waitUntil: "domcontentloaded", timeout: WAIT });
  await page.locator(".monaco-workbench").waitFor({ timeout: WAIT });
  await page.keyboard.press("Control+P");
  const quick = page.locator(".quick-input-widget input");
  await quick.waitFor({ state: "visible", timeout: WAIT });
  await quick.fill(fileName);
  await page.locator(".quick-input-list .monaco-list-row").first().waitFor({ timeout: WAIT });
  await page.keyboard.press("Enter");
  await page.locator(".monaco-editor .view-lines").first().click();
  await page.locator(".statusbar .codicon-sparkle").first().waitFor({ timeout: WAIT }); // the model is ready
  await page.keyboard.press("Control+B"); // hide the side bars: more room for the editor
  if (await page.locator(".part.auxiliarybar").isVisible()) {
    await page.keyboard.press("Control+Alt+B");
  }
  await page.keyboard.press("Control+G");
  await quick.waitFor({ state: "visible", timeout: WAIT });
  await quick.fill(`:${line}`);
  await page.keyboard.press("Enter");
  await page.keyboard.press("End");
  await page.keyboard.type(typed, { delay: 80 });
  const ghost = page.locator(".ghost-text-decoration, .ghost-text", { hasText: expected });
  for (let attempt = 0; attempt < 10 && !(await ghost.count()); attempt++) {
    try {
      await ghost.first().waitFor({ timeout: 6000 });
    } catch {
      await page.keyboard.press("Alt+Backslash"); // editor.action.inlineSuggest.trigger
    }
  }
  await ghost.first().waitFor({ timeout: WAIT });
  await page.mouse.move(0, 0);
  await page.waitForTimeout(500);
  await page.screenshot({ path: out });
} finally {
  await browser.close();
}
