#!/usr/bin/env python3
"""ws-load.py URL FAST SLOW SECONDS: websocket clients against trainmonitor.

FAST clients read every message; SLOW clients finish the handshake and
then never read, so the server's writes to them back up.  After SECONDS
it prints one line, "fast min M max X slow_open S", with the fewest and
the most messages a fast client got and how many slow sockets the server
still kept open, and exits 0; 1 when a handshake failed.  One process,
one thread, the standard library only (selectors)."""
import base64
import os
import selectors
import socket
import struct
import sys
import time
from urllib.parse import urlparse

url, fast, slow, seconds = (urlparse(sys.argv[1]), int(sys.argv[2]),
                            int(sys.argv[3]), float(sys.argv[4]))
path = url.path + ("?" + url.query if url.query else "")
sel = selectors.DefaultSelector()


def connect(read):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if not read:  # a small window (set before the SYN) fills quickly
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.settimeout(10)
    s.connect((url.hostname, url.port))
    key = base64.b64encode(os.urandom(16)).decode()
    s.sendall(("GET %s HTTP/1.1\r\nHost: %s:%d\r\nUpgrade: websocket\r\n"
               "Connection: Upgrade\r\nSec-WebSocket-Key: %s\r\n"
               "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: "
               "beed-monitor\r\n\r\n" % (path, url.hostname, url.port,
                                         key)).encode())
    buf = b""
    while b"\r\n\r\n" not in buf:
        d = s.recv(1 if not read else 4096)  # slow: no more than the head
        if not d:
            print("handshake: closed")
            sys.exit(1)
        buf += d
    head, rest = buf.split(b"\r\n\r\n", 1)
    if b" 101 " not in head.split(b"\r\n")[0]:
        print("handshake:", head.split(b"\r\n")[0].decode())
        sys.exit(1)
    s.setblocking(False)
    return s, rest


clients = []
for i in range(fast):
    s, rest = connect(True)
    c = {"s": s, "buf": rest, "n": 0}
    clients.append(c)
    sel.register(s, selectors.EVENT_READ, c)
slows = [connect(False)[0] for _ in range(slow)]


def frames(c):
    while True:
        b = c["buf"]
        if len(b) < 2:
            return
        n, off = b[1] & 0x7F, 2
        if n == 126:
            if len(b) < 4:
                return
            n, off = struct.unpack(">H", b[2:4])[0], 4
        elif n == 127:
            if len(b) < 10:
                return
            n, off = struct.unpack(">Q", b[2:10])[0], 10
        if len(b) < off + n:
            return
        if b[0] & 0x0F == 1:
            c["n"] += 1
        c["buf"] = b[off + n:]


end = time.time() + seconds
while time.time() < end:
    for key, _ in sel.select(timeout=0.5):
        c = key.data
        try:
            d = c["s"].recv(65536)
        except BlockingIOError:
            continue
        if not d:
            sel.unregister(c["s"])
            continue
        c["buf"] += d
        frames(c)
open_slow = 0
for s in slows:  # still open: a zero-length read would be EOF
    try:
        s.setblocking(False)
        if s.recv(1, socket.MSG_PEEK):
            open_slow += 1  # unread data, the server's
    except BlockingIOError:
        open_slow += 1  # nothing to read, not closed
    except OSError:
        pass
counts = [c["n"] for c in clients]
print("fast min %d max %d slow_open %d" % (min(counts), max(counts), open_slow))
