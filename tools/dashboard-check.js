/* tools/dashboard-check.js URL: loads trainmonitor's dashboard in jsdom
 * (a DOM in Node, no browser), runs its script against the live monitor
 * for 4 s and prints what a person would see: the headline figures, the
 * peers table's rows, the events, whether the charts drew, and every
 * script error.  Exits 1 on a script error or an empty page.
 *
 * A development check, not part of the suite (it needs jsdom from npm):
 *   mkdir /tmp/jsd && cd /tmp/jsd && npm install jsdom@24
 *   NODE_PATH=/tmp/jsd/node_modules node tools/dashboard-check.js \
 *       'http://127.0.0.1:8080/?token=...'
 * jsdom has no canvas: getContext returns a stub that counts the calls.
 */
"use strict";
const { JSDOM, VirtualConsole } = require("jsdom");

const url = process.argv[2];
if (!url) {
  console.error("usage: dashboard-check.js URL");
  process.exit(2);
}
const errors = [];
const vc = new VirtualConsole();
vc.on("jsdomError", (e) => errors.push(e.message));
vc.on("error", (e) => errors.push(String(e)));

function canvasStub(w) {
  const props = ["font", "fillStyle", "strokeStyle", "lineWidth"];
  w.HTMLCanvasElement.prototype.getContext = function () {
    const calls = (this._calls = this._calls || []);
    return new Proxy({}, {
      get: (t, k) => k === "measureText" ? () => ({ width: 10 })
        : typeof k === "string" && !props.includes(k) ? () => calls.push(k)
        : undefined,
      set: () => true,
    });
  };
}

(async () => {
  const dom = await JSDOM.fromURL(url, {
    runScripts: "dangerously", resources: "usable", pretendToBeVisual: true,
    virtualConsole: vc,
    beforeParse(w) {
      w.fetch = (u, o) => fetch(new URL(u, url), o); // Node's, same origin
      canvasStub(w);
    },
  });
  await new Promise((r) => setTimeout(r, 4000));
  const d = dom.window.document, txt = (id) => d.getElementById(id).textContent;
  const rows = d.querySelectorAll("#rows tr");
  console.log(`run ${txt("run")}: epoch ${txt("epoch")}, ${txt("samples")} of ` +
    `${txt("target")} samples (${txt("eta")}); ${txt("sps")} samples/s, ` +
    `${txt("peers")} peers, loss ${txt("loss")}; connection: ${txt("conn")}`);
  console.log(`peers table: ${rows.length} rows; events: ` +
    `${d.querySelectorAll("#events div").length}; chart drawing calls: ` +
    `${(d.getElementById("c-sps")._calls || []).length}`);
  for (const r of rows)
    console.log("  " + [...r.children].map((c) => c.textContent).join(" | "));
  console.log("script errors: " + (errors.length ? errors.join("\n") : "none"));
  dom.window.close();
  process.exit(errors.length || !rows.length ? 1 : 0);
})();
