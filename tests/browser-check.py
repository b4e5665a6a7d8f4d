#!/usr/bin/env python3
"""browser-check.py URL BEES PNG: trainmonitor's dashboard in a real
browser (headless Chromium, Debian's chromium package), driven through
its DevTools protocol with the standard library only.

Opens URL, lets the page run, and reads back what a person would see:
the peers table's rows and labels, the epoch and the progress bar, the
link matrix's cells, and how many pixels each chart drew; then the same
again a few seconds later, and saves a screenshot as PNG.  Every script
error the page raised (an exception, console.error, a failed load) is
collected.  Prints one line per finding; exits 0 when the page loaded
without script errors, lists BEES bees, draws every chart, shows the link
matrix and its progress moved; 1 otherwise; 77 without chromium."""
import base64
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from urllib.parse import urlparse

url, bees, png = sys.argv[1], int(sys.argv[2]), sys.argv[3]
chromium = shutil.which("chromium")
if not chromium:
    print("SKIP: no chromium (apt-get install chromium)")
    sys.exit(77)


class Ws:
    """A websocket client: masked text frames out, any frames in."""

    def __init__(self, u):
        u = urlparse(u)
        self.s = socket.create_connection((u.hostname, u.port), timeout=30)
        key = base64.b64encode(os.urandom(16)).decode()
        self.s.sendall(("GET %s HTTP/1.1\r\nHost: %s:%d\r\nUpgrade: websocket\r\n"
                        "Connection: Upgrade\r\nSec-WebSocket-Key: %s\r\n"
                        "Sec-WebSocket-Version: 13\r\n\r\n"
                        % (u.path, u.hostname, u.port, key)).encode())
        self.buf = b""
        while b"\r\n\r\n" not in self.buf:
            self.more()
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        if b" 101 " not in head.split(b"\r\n")[0]:
            raise RuntimeError("no websocket: %r" % head[:80])

    def more(self):
        data = self.s.recv(1 << 20)
        if not data:
            raise RuntimeError("the browser closed the connection")
        self.buf += data

    def send(self, text):
        data, mask = text.encode(), os.urandom(4)
        n = len(data)
        head = bytes([0x81, 0x80 | n]) if n < 126 else \
            bytes([0x81, 0x80 | 126]) + struct.pack(">H", n) if n < 65536 else \
            bytes([0x81, 0x80 | 127]) + struct.pack(">Q", n)
        self.s.sendall(head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))

    def recv(self):
        while True:
            while len(self.buf) < 2:
                self.more()
            op, n, off = self.buf[0] & 0x0F, self.buf[1] & 0x7F, 2
            if n == 126:
                while len(self.buf) < 4:
                    self.more()
                n, off = struct.unpack(">H", self.buf[2:4])[0], 4
            elif n == 127:
                while len(self.buf) < 10:
                    self.more()
                n, off = struct.unpack(">Q", self.buf[2:10])[0], 10
            while len(self.buf) < off + n:
                self.more()
            data, self.buf = self.buf[off:off + n], self.buf[off + n:]
            if op == 8:
                raise RuntimeError("the browser closed the connection")
            if op == 1:
                return json.loads(data)


profile = tempfile.mkdtemp(prefix="beed-chromium-")
proc = subprocess.Popen(
    [chromium, "--headless=new", "--no-sandbox", "--disable-gpu",
     "--no-first-run", "--no-default-browser-check", "--disable-extensions",
     "--user-data-dir=" + profile, "--window-size=1400,1500",
     "--remote-debugging-port=0", "about:blank"],
    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
errors, seq = [], 0
try:
    port = None
    t0 = time.time()
    while port is None and time.time() - t0 < 60:
        line = proc.stderr.readline()
        if not line:
            break
        m = re.search(r"DevTools listening on ws://127\.0\.0\.1:(\d+)/", line)
        if m:
            port = int(m.group(1))
    if port is None:
        print("chromium did not start")
        sys.exit(1)
    with urllib.request.urlopen("http://127.0.0.1:%d/json/list" % port, timeout=10) as r:
        page = [t for t in json.load(r) if t["type"] == "page"][0]
    ws = Ws(page["webSocketDebuggerUrl"])

    def call(method, **params):
        global seq
        seq += 1
        ws.send(json.dumps({"id": seq, "method": method, "params": params}))
        while True:
            msg = ws.recv()
            if msg.get("id") == seq:
                if "error" in msg:
                    raise RuntimeError("%s: %s" % (method, msg["error"]))
                return msg.get("result", {})
            event(msg)

    def event(msg):
        m, p = msg.get("method"), msg.get("params", {})
        if m == "Runtime.exceptionThrown":
            d = p["exceptionDetails"]
            errors.append("exception: " + d.get("exception", {}).get(
                "description", d.get("text", "?")).split("\n")[0])
        elif m == "Runtime.consoleAPICalled" and p.get("type") == "error":
            errors.append("console.error: " + " ".join(
                str(a.get("value", a.get("description", ""))) for a in p["args"]))
        elif m == "Log.entryAdded" and p["entry"]["level"] == "error":
            errors.append("log: %s %s" % (p["entry"]["text"], p["entry"].get("url", "")))

    def pump(seconds):
        """Takes the events of the next seconds."""
        end = time.time() + seconds
        while time.time() < end:
            ws.s.settimeout(max(0.05, end - time.time()))
            try:
                event(ws.recv())
            except socket.timeout:
                pass
        ws.s.settimeout(30)

    call("Runtime.enable")
    call("Log.enable")
    call("Page.enable")
    call("Page.navigate", url=url)
    look = r"""(() => {
      const $ = (id) => document.getElementById(id);
      const drawn = [...document.querySelectorAll("canvas")].map((c) => {
        if (!c.width || !c.height) return 0;
        const d = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
        let n = 0;
        for (let i = 3; i < d.length; i += 4) n += d[i] > 0;
        return n;
      });
      return JSON.stringify({
        rows: document.querySelectorAll("#rows tr").length,
        labels: [...document.querySelectorAll("#rows tr")].map((r) => r.children[1].textContent).sort(),
        epoch: $("epoch").textContent, samples: $("samples").textContent,
        progress: $("progress").style.width, conn: $("conn").textContent,
        cells: document.querySelectorAll("#links td.cell").length,
        heat: document.querySelectorAll("#links td[class*=' h']").length,
        note: $("links-note").textContent, drawn: drawn });
    })()"""
    pump(8)
    first = json.loads(call("Runtime.evaluate", expression=look)["result"]["value"])
    pump(6)
    second = json.loads(call("Runtime.evaluate", expression=look)["result"]["value"])
    shot = call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
    with open(png, "wb") as f:
        f.write(base64.b64decode(shot["data"]))
finally:
    proc.kill()
    proc.wait()
    shutil.rmtree(profile, ignore_errors=True)

print("first look:", json.dumps(first))
print("six seconds later:", json.dumps(second))
print("screenshot:", png, os.path.getsize(png), "bytes")
bad = ["script error: " + e for e in errors]
if second["rows"] != bees:
    bad.append("%d peers listed, not %d" % (second["rows"], bees))
if not second["drawn"] or min(second["drawn"]) == 0:
    bad.append("a chart drew nothing: %s" % second["drawn"])
if second["cells"] < bees * (bees - 1) or second["heat"] == 0:
    bad.append("the link matrix: %d cells, %d colored (%s)"
               % (second["cells"], second["heat"], second["note"]))
if (first["epoch"], first["samples"], first["progress"]) == \
        (second["epoch"], second["samples"], second["progress"]):
    bad.append("the progress did not move in six seconds")
for b in bad:
    print("FAIL:", b)
sys.exit(1 if bad else 0)
