"""Screenshots of a `snakemake --report` page in headless Chromium: each table and figure as the report shows it.

    snakemake --report report.html                                 # (add --configfile=... as for the run)
    python scripts/report_screenshots.py report.html docs/report-shots [--only a_accuracy b_passk ...]

For every result of the report (a table's HTML page, a figure's PNG) it opens the result's category in the
report's menu, clicks the result's eye button, as a reader would, and saves the window as
<out>/<name>-table.png or <out>/<name>-figure.png; <out>/index.txt lists what each shot shows. Only the Python standard library and a
Chromium binary (Debian: `apt-get install -y chromium`; --chromium PATH for another) are needed: the page
is driven over the DevTools protocol on a pipe (--remote-debugging-pipe), in a fresh profile.
"""

from __future__ import annotations

import argparse
import base64
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run",
         "--remote-debugging-pipe"]


class Browser:
    """Chromium with the DevTools protocol on fds 3 (commands in) and 4 (answers out), NUL-separated JSON."""

    def __init__(self, chromium: str, profile: str) -> None:
        to_browser, self._write = os.pipe()
        self._read, from_browser = os.pipe()
        # The browser reads fd 3 and writes fd 4: bash (dash takes no fd above 9) maps the pipe ends there after subprocess has closed
        # every other fd (pipe ends moved to fds >= 10 first, so that no redirection overwrites another).
        ends = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_browser, from_browser)]
        for fd in (to_browser, from_browser):
            os.close(fd)
        command = [chromium, *FLAGS, f"--user-data-dir={profile}", "about:blank"]
        self.process = subprocess.Popen(["bash", "-c", f'exec "$0" "$@" 3<&{ends[0]} 4>&{ends[1]}', *command],
                                        pass_fds=ends, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for fd in ends:
            os.close(fd)
        self._buffer, self._next = b"", 0
        self.session: str | None = None

    def send(self, method: str, params: dict | None = None, session: bool = True) -> dict:
        self._next += 1
        message = {"id": self._next, "method": method, "params": params or {}}
        if session and self.session:
            message["sessionId"] = self.session
        os.write(self._write, json.dumps(message).encode() + b"\0")
        while True:  # answers come in order with events between them
            reply = self._message()
            if reply.get("id") == self._next:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def _message(self) -> dict:
        while b"\0" not in self._buffer:
            chunk = os.read(self._read, 1 << 20)
            if not chunk:
                raise RuntimeError("chromium closed the DevTools pipe (did it start? try it by hand with --headless)")
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(raw)

    def open(self, url: str, width: int, height: int) -> None:
        target = self.send("Target.createTarget", {"url": "about:blank"}, session=False)["targetId"]
        self.session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True}, session=False)[
            "sessionId"]
        self.send("Emulation.setDeviceMetricsOverride", {"width": width, "height": height, "deviceScaleFactor": 1,
                                                         "mobile": False})
        self.send("Page.navigate", {"url": url})
        self.wait_for("document.readyState === 'complete' && typeof results !== 'undefined'")

    def js(self, expression: str):
        result = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                "awaitPromise": True})
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression[:80]}...: {result['exceptionDetails'].get('text')}")
        return result["result"].get("value")

    def wait_for(self, condition: str, timeout: float = 30.0) -> None:
        deadline = time.time() + timeout
        while not self.js(f"Boolean({condition})"):
            if time.time() > deadline:
                raise TimeoutError(condition)
            time.sleep(0.1)

    def screenshot(self, path: Path) -> None:
        data = self.send("Page.captureScreenshot", {"format": "png"})["data"]
        path.write_bytes(base64.b64decode(data))

    def close(self) -> None:
        try:
            self.send("Browser.close", session=False)
        except (RuntimeError, OSError):
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


# `categories` maps category -> subcategory -> the result paths in it (a result's entry does not say).
WHERE = """var where = path => { for (const [c, subs] of Object.entries(categories))
  for (const [s, paths] of Object.entries(subs)) if (paths.includes(path)) return [c, s]; return [null, null]; };"""

# The report's own app (snakemake/report/html_reporter/template): `results` maps each result's path to its
# entry, `app.setView` opens a category's subcategory in the menu. The eye button of a result's row opens it, in the
# content pane: an <img> for a PNG, an <iframe> for an HTML page.
SHOW = """(async () => {
  const path = %s;
  const pause = () => new Promise(r => setTimeout(r, 300));
  const [category, subcategory] = where(path);
  // as a reader does: the category's list of subcategories, then the subcategory (its list is built anew)
  app.setView({navbarMode: "category", category: category});
  await pause();
  app.setView({navbarMode: "subcategory", category: category, subcategory: subcategory});
  await pause();
  const row = [...document.querySelectorAll("tr")].find(
      tr => tr.querySelector("td") && tr.querySelector("td").textContent.trim() === path);
  if (!row) return "no menu row for " + path;
  row.querySelector("div[role=group] a").click();  // the eye: the first button of the row
  await pause();
  return "opened from the menu";
})()"""


def shoot(report: Path, out: Path, only: list[str], chromium: str, width: int, height: int) -> list[str]:
    out.mkdir(parents=True, exist_ok=True)
    profile = tempfile.mkdtemp(prefix="report-shots-profile-")
    browser = Browser(chromium, profile)
    lines = []
    try:
        browser.open(report.resolve().as_uri(), width, height)
        browser.js(WHERE)
        entries = browser.js("Object.entries(results).map(([p, e]) => [p, e.name, e.mime_type, ...where(p)])")
        for path, name, mime, category, subcategory in sorted(entries, key=lambda e: (e[3], e[4] or "", e[1])):
            if only and Path(name).stem not in only:
                continue
            if mime not in ("text/html", "image/png"):
                continue
            state = browser.js(SHOW % json.dumps(path))
            if state != "opened from the menu":
                raise RuntimeError(f"{path}: {state}")
            tag = "iframe" if mime == "text/html" else "img"
            browser.wait_for(f"app.state.resultPath === {json.dumps(path)} && document.querySelector('{tag}')")
            time.sleep(0.8)  # the frame's (the image's) first paint
            shot = out / f"{Path(name).stem}-{'table' if mime == 'text/html' else 'figure'}.png"
            browser.screenshot(shot)
            lines.append(f"{shot.name}\t{category} / {subcategory}\t{name}\t{state}")
            print(lines[-1], flush=True)
    finally:
        browser.close()
        shutil.rmtree(profile, ignore_errors=True)
    (out / "index.txt").write_text("\n".join(lines) + "\n")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("report", type=Path, help="the report.html snakemake --report wrote")
    parser.add_argument("out", type=Path, help="folder for the screenshots")
    parser.add_argument("--only", nargs="*", default=[], help="result names (file stems) to shoot; default all")
    parser.add_argument("--chromium", default=shutil.which("chromium") or "chromium")
    parser.add_argument("--width", type=int, default=1440)
    parser.add_argument("--height", type=int, default=900)
    args = parser.parse_args(argv)
    if not args.report.exists():
        sys.exit(f"{args.report}: no such report; make it with snakemake --report {args.report}")
    shoot(args.report, args.out, args.only, args.chromium, args.width, args.height)


if __name__ == "__main__":
    main()
