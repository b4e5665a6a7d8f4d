#!/usr/bin/env python3
"""ws-client.py URL N [REQUEST]: a minimal websocket client for the tests
(the standard library only; Debian's python3-websockets is not needed).

Connects to URL (ws://HOST:PORT/PATH?QUERY) with the protocol
"beed-monitor", prints the status line of the handshake, sends REQUEST
(a text message) if given, then reads N text messages and prints one line
per message: "snapshot EPOCH PEERS", "history POINTS FIRST_T LAST_T" or
"error TEXT".  Exits 1 when the server refuses the upgrade or closes
early, 2 on a timeout (10 s per message)."""
import base64
import json
import os
import socket
import struct
import sys
from urllib.parse import urlparse

url, count = urlparse(sys.argv[1]), int(sys.argv[2])
path = url.path + ("?" + url.query if url.query else "")
sock = socket.create_connection((url.hostname, url.port), timeout=10)
key = base64.b64encode(os.urandom(16)).decode()
sock.sendall(("GET %s HTTP/1.1\r\nHost: %s:%d\r\nUpgrade: websocket\r\n"
              "Connection: Upgrade\r\nSec-WebSocket-Key: %s\r\n"
              "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: beed-monitor"
              "\r\n\r\n" % (path, url.hostname, url.port, key)).encode())
buf = b""


def need(k):
    global buf
    while len(buf) < k:
        data = sock.recv(65536)
        if not data:
            print("closed by the server")
            sys.exit(1)
        buf += data


try:
    while b"\r\n\r\n" not in buf:
        data = sock.recv(4096)
        if not data:
            print("closed during the handshake")
            sys.exit(1)
        buf += data
    head, buf = buf.split(b"\r\n\r\n", 1)
    status = head.split(b"\r\n")[0].decode()
    print(status)
    if " 101 " not in status:
        sys.exit(1)
    if len(sys.argv) > 3:  # a client's frames are masked
        data, mask = sys.argv[3].encode(), os.urandom(4)
        head = bytes([0x81, 0x80 | len(data)]) if len(data) < 126 else \
            bytes([0x81, 0x80 | 126]) + struct.pack(">H", len(data))
        sock.sendall(head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))
    got = 0
    while got < count:
        need(2)
        op, n, off = buf[0] & 0x0F, buf[1] & 0x7F, 2
        if n == 126:
            need(4)
            n, off = struct.unpack(">H", buf[2:4])[0], 4
        elif n == 127:
            need(10)
            n, off = struct.unpack(">Q", buf[2:10])[0], 10
        need(off + n)
        data, buf = buf[off:off + n], buf[off + n:]
        if op == 8:
            print("closed by the server")
            sys.exit(1)
        if op != 1:
            continue
        msg = json.loads(data)
        if msg["type"] == "snapshot":
            snap = msg["data"]
            now = snap["now"]
            print("snapshot", now["epoch"] if now else "-", len(snap["peers"]))
        elif msg["type"] == "history":
            pts = msg["data"]
            print("history", len(pts), pts[0]["t"] if pts else "-",
                  pts[-1]["t"] if pts else "-")
        else:
            print(msg["type"], msg.get("error", ""))
        got += 1
except socket.timeout:
    print("timed out")
    sys.exit(2)
