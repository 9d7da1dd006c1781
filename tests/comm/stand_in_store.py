#!/usr/bin/env python3
"""tests/comm/stand_in_store.py — a stand-in for the TCP store torchrun's
agent keeps on MASTER_PORT, written from PyTorch's TCPStore wire protocol
(c10d: one command byte, then its arguments; strings and values as a u64
length and their bytes; numbers little-endian), so that tests/comm can run
loom's ranks as torchrun starts them without PyTorch installed.

usage: stand_in_store.py PORT_FILE LOG_FILE [::1]
Listens on a free port of 127.0.0.1 (or of IPv6's ::1), writes it to PORT_FILE, and serves
until killed. Each command is logged to LOG_FILE, one line each
("VALIDATE ok", "SET /worker/attempt_0/x", ...). Like PyTorch's server it
drops a connection that sends an unknown command or a wrong validation
number; unlike it, it also drops one whose first command is not VALIDATE,
so that a client that skips PyTorch 2.x's handshake is caught.
"""
import selectors
import socket
import struct
import sys

VALIDATE, SET, COMPARE_SET, GET, ADD, CHECK, WAIT, GETNUMKEYS, DELETE_KEY = range(9)
CANCEL_WAIT, PING = 12, 13
MAGIC = 0x3C85F7CE
STOP_WAITING, WAIT_CANCELED = 0, 1
READY, NOT_READY = 0, 1


class Need(Exception):
    """The command is not all there yet."""


class Conn:
    def __init__(self, sock):
        self.sock = sock
        self.buf = b""
        self.validated = False
        self.waiting = None  # keys of a pending WAIT

    def take(self, n, at):
        if len(self.buf) < at + n:
            raise Need()
        return self.buf[at:at + n], at + n

    def u64(self, at):
        b, at = self.take(8, at)
        return struct.unpack("<Q", b)[0], at

    def string(self, at):
        n, at = self.u64(at)
        if n > 1 << 20:
            raise ValueError(f"string of {n} bytes")
        return self.take(n, at)


class Store:
    def __init__(self, log):
        self.kv = {}
        self.log = log
        self.conns = []

    def note(self, text):
        self.log.write(text + "\n")
        self.log.flush()

    def send(self, c, data):
        c.sock.sendall(data)

    def wake(self):
        for c in self.conns:
            if c.waiting is not None and all(k in self.kv for k in c.waiting):
                c.waiting = None
                self.send(c, bytes([STOP_WAITING]))

    def one(self, c):
        """Executes the first whole command in c.buf; returns its length."""
        cmd, at = c.buf[0], 1
        if not c.validated and cmd != VALIDATE:
            raise ValueError(f"command {cmd} before VALIDATE")
        if cmd == VALIDATE:
            b, at = c.take(4, at)
            magic = struct.unpack("<I", b)[0]
            if magic != MAGIC:
                raise ValueError(f"validation number {magic:#x}")
            c.validated = True
            self.note("VALIDATE ok")
        elif cmd == PING:
            b, at = c.take(4, at)
            self.note("PING")
            self.send(c, b)
        elif cmd == SET:
            k, at = c.string(at)
            v, at = c.string(at)
            self.kv[k] = v
            self.note(f"SET {k.decode(errors='replace')} {v.decode(errors='replace')}")
            self.wake()
        elif cmd == GET:
            k, at = c.string(at)
            self.note(f"GET {k.decode(errors='replace')}")
            if k not in self.kv:
                raise ValueError("GET of a missing key")
            v = self.kv[k]
            self.send(c, struct.pack("<Q", len(v)) + v)
        elif cmd == ADD:
            k, at = c.string(at)
            b, at = c.take(8, at)
            v = int(self.kv.get(k, b"0")) + struct.unpack("<q", b)[0]
            self.kv[k] = str(v).encode()
            self.send(c, struct.pack("<q", v))
            self.wake()
        elif cmd in (CHECK, WAIT):
            n, at = c.u64(at)
            keys = []
            for _ in range(n):
                k, at = c.string(at)
                keys.append(k)
            self.note(f"{'WAIT' if cmd == WAIT else 'CHECK'} "
                      + " ".join(k.decode(errors='replace') for k in keys))
            ready = all(k in self.kv for k in keys)
            if cmd == CHECK:
                self.send(c, bytes([READY if ready else NOT_READY]))
            elif ready:
                self.send(c, bytes([STOP_WAITING]))
            else:
                c.waiting = keys
        elif cmd == CANCEL_WAIT:
            c.waiting = None
            self.note("CANCEL_WAIT")
            self.send(c, bytes([WAIT_CANCELED]))
        elif cmd == GETNUMKEYS:
            self.send(c, struct.pack("<q", len(self.kv)))
        elif cmd == DELETE_KEY:
            k, at = c.string(at)
            self.send(c, struct.pack("<q", 1 if self.kv.pop(k, None) is not None else 0))
        elif cmd == COMPARE_SET:
            k, at = c.string(at)
            old, at = c.string(at)
            new, at = c.string(at)
            cur = self.kv.get(k)
            if (cur is None and not old) or cur == old:
                self.kv[k] = cur = new
            self.send(c, struct.pack("<Q", len(cur or old)) + (cur or old))
        else:
            raise ValueError(f"unknown command {cmd}")
        return at


def main(argv):
    if len(argv) not in (3, 4):
        print(__doc__, file=sys.stderr)
        return 2
    v6 = len(argv) == 4
    lsock = socket.socket(socket.AF_INET6 if v6 else socket.AF_INET)
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lsock.bind(("::1" if v6 else "127.0.0.1", 0))
    lsock.listen(64)
    log = open(argv[2], "a")
    store = Store(log)
    sel = selectors.DefaultSelector()
    sel.register(lsock, selectors.EVENT_READ, None)
    with open(argv[1] + ".tmp", "w") as f:
        f.write(str(lsock.getsockname()[1]))
    import os
    os.rename(argv[1] + ".tmp", argv[1])
    while True:
        for key, _ in sel.select():
            if key.data is None:
                s, _ = lsock.accept()
                c = Conn(s)
                store.conns.append(c)
                sel.register(s, selectors.EVENT_READ, c)
                continue
            c = key.data
            try:
                data = c.sock.recv(65536)
            except OSError:
                data = b""
            if data:
                c.buf += data
            try:
                while c.buf:
                    n = store.one(c)
                    c.buf = c.buf[n:]
            except Need:
                pass
            except (ValueError, OSError) as e:
                store.note(f"DROPPED: {e}")
                data = b""
            if not data:
                sel.unregister(c.sock)
                c.sock.close()
                store.conns.remove(c)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
