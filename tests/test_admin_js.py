"""The sentences the admin's script shows after an action, run in Node.js.

``static/admin.js`` runs here against a few stand-ins for the browser (the
document, ``fetch``, ``window.confirm``): a button or form is "clicked" and
the API's answer given, and the test reads the flash line and the
confirmation question the reader would see. No browser is needed (the
Playwright tests in test_admin_browser.py drive a real one where Chromium is
installed); Node.js is the one Playwright ships, or ``node`` on the PATH.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "novaque" / "admin" / "static" / "admin.js"

#: Browser stand-ins, then each case: ["click", answer] POSTs through a
#: ``data-post`` button whose request gets ``answer``; ["redrive", fields]
#: submits the redrive form with ``fields`` and records the question.
HARNESS = r"""
const fs = require("fs");
const [script, casesJson] = process.argv.slice(-2);
const cases = JSON.parse(casesJson);
const listeners = {};
const flash = { textContent: "", className: "", hidden: true };
const asked = [];
let answer = null;
class Element {}
class HTMLFormElement extends Element {}
function node(attrs, extra) {
  const made = Object.create((extra && extra.form ? HTMLFormElement : Element).prototype);
  return Object.assign(made, {
    id: "",
    hasAttribute: (name) => name in attrs,
    getAttribute: (name) => (name in attrs ? attrs[name] : null),
    closest() { return this; },
  }, extra || {});
}
Object.assign(globalThis, {
  Element,
  HTMLFormElement,
  setTimeout: () => 0,
  clearTimeout: () => undefined,
  fetch: async () => ({ ok: true, json: async () => answer }),
  window: {
    confirm: (question) => { asked.push(question); return false; },
    location: { reload() {}, assign() {} },
  },
  document: {
    querySelector: () => null,
    querySelectorAll: () => [],
    getElementById: (id) => (id === "flash" ? flash : null),
    addEventListener: (name, listener) => { listeners[name] = listener; },
  },
});
new Function(fs.readFileSync(script, "utf8"))();
(async () => {
  const seen = [];
  for (const [kind, given] of cases) {
    if (kind === "click") {
      answer = given;
      flash.textContent = "";
      listeners.click({ target: node({ "data-post": "/api/x" }), preventDefault() {} });
      for (let i = 0; i < 10; i++) await Promise.resolve();
      seen.push(flash.textContent);
    } else {
      const elements = {
        to_channel: { value: given.to || "" },
        limit: { value: given.limit || "" },
      };
      const attrs = {
        "data-redrive": "/api/x",
        "data-topic-name": "orders",
        "data-channel-name": "billing",
      };
      listeners.submit({ target: node(attrs, { form: true, elements }), preventDefault() {} });
      seen.push(asked.pop());
    }
  }
  console.log(JSON.stringify(seen));
})();
"""


def node_binary() -> str:
    found = shutil.which("node")
    if found is not None:
        return found
    try:
        import playwright
    except ImportError:
        pytest.skip("no Node.js: neither node on the PATH nor the playwright package")
    bundled = Path(playwright.__file__).parent / "driver" / "node"
    if not bundled.is_file():
        pytest.skip(f"no Node.js: node is not on the PATH and {bundled} is missing")
    return str(bundled)


def run_script(cases: list[list[object]]) -> list[str]:
    done = subprocess.run(
        [node_binary(), "-e", HARNESS, "--", str(SCRIPT), json.dumps(cases)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    seen: list[str] = json.loads(done.stdout)
    return seen


def test_flash_lines_and_questions_count_in_words() -> None:
    """One dead letter, two dead letters: the command line's words, never "(s)"."""
    seen = run_script(
        [
            ["click", {"requeued": 1}],
            ["click", {"requeued": 2}],
            ["click", {"deleted": 1}],
            ["click", {"deleted": 0}],
            ["click", {"replayed": 1}],
            ["click", {"replayed": 3}],
            ["click", {"cancelled": 1}],
            ["click", {"cancelled": 2}],
            ["redrive", {"limit": "1"}],
            ["redrive", {"limit": "5", "to": "retry"}],
            ["redrive", {}],
        ]
    )
    assert seen == [
        "Requeued 1 dead letter.",
        "Requeued 2 dead letters.",
        "Deleted 1 dead letter.",
        "Deleted 0 dead letters.",
        "Replayed: 1 delivery created.",
        "Replayed: 3 deliveries created.",
        "Cancelled 1 never-attempted delivery.",
        "Cancelled 2 never-attempted deliveries.",
        "Requeue the dead letter that died first of orders/billing?",
        "Requeue the 5 dead letters that died first of orders/billing into channel retry?",
        "Requeue every dead letter of orders/billing?",
    ]
    assert not any("(s)" in line for line in seen)
