"""A HOSTILE BitTorrent peer for tests: it speaks the plain wire protocol (BEP 3), says it
has every piece, unchokes at once and answers every request with random bytes. What a
compromised fleet host, or a host whose disk returns garbage, would send."""
from __future__ import annotations

import os
import socket
import struct
import threading

PSTR = b"BitTorrent protocol"


class BadPeer:
    """`with BadPeer(address, port, num_pieces) as bad:`; bad.blocks_sent counts answers."""

    def __init__(self, address, port, num_pieces):
        self.address, self.port, self.num_pieces = address, port, num_pieces
        self.blocks_sent = 0
        self.connections = 0
        self._sock = None
        self._stop = threading.Event()

    def __enter__(self):
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((self.address, self.port))
        self._sock.listen(8)
        self._sock.settimeout(0.2)
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._sock.close()

    def _accept(self):
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                continue
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _bitfield(self):
        bits = bytearray((self.num_pieces + 7) // 8)
        for i in range(self.num_pieces):
            bits[i // 8] |= 0x80 >> (i % 8)
        return bytes(bits)

    def _serve(self, conn):
        conn.settimeout(30)
        try:
            with conn, conn.makefile("rb") as rf:
                hs = rf.read(68)
                if len(hs) < 68 or hs[1:20] != PSTR:
                    return
                infohash = hs[28:48]
                conn.sendall(bytes([19]) + PSTR + bytes(8) + infohash + b"-XX0001-" +
                             os.urandom(12))
                bitfield = self._bitfield()
                conn.sendall(struct.pack(">IB", 1 + len(bitfield), 5) + bitfield)
                conn.sendall(struct.pack(">IB", 1, 1))  # unchoke
                while not self._stop.is_set():
                    head = rf.read(4)
                    if len(head) < 4:
                        return
                    (length,) = struct.unpack(">I", head)
                    body = rf.read(length)
                    if length and body[0] == 6 and length == 13:  # request
                        index, begin, size = struct.unpack(">III", body[1:13])
                        conn.sendall(struct.pack(">IBII", 9 + size, 7, index, begin)
                                     + os.urandom(size))
                        self.blocks_sent += 1
        except OSError:
            return
