#!/usr/bin/env python3
"""Extract fuzz seeds from the golden captures: the UDP payload (BTH..ICRC) of the first packet
of every (opcode, length) pair in tests/data/*.pcap, written to fuzz/seeds/<capture>-<n>.bin.
Run from the repository root: python3 fuzz/make-seeds.py"""
import glob, os, struct

seen = set()
os.makedirs("fuzz/seeds", exist_ok=True)
for path in sorted(glob.glob("tests/data/*.pcap")):
    with open(path, "rb") as f:
        f.read(24)
        n = 0
        while True:
            rh = f.read(16)
            if len(rh) < 16:
                break
            incl = struct.unpack("<IIII", rh)[2]
            fr = f.read(incl)
            if len(fr) < 42 or fr[12:14] != b"\x08\x00" or fr[23] != 17:
                continue
            ihl = (fr[14] & 0xF) * 4
            udp = fr[14 + ihl:14 + ihl + 8]
            if struct.unpack(">H", udp[2:4])[0] != 4791:
                continue
            ulen = struct.unpack(">H", udp[4:6])[0]
            payload = fr[14 + ihl + 8:14 + ihl + ulen]
            key = (payload[0], len(payload))
            if key in seen:
                continue
            seen.add(key)
            n += 1
            name = os.path.basename(path)[:-5]
            with open(f"fuzz/seeds/{name}-{n}.bin", "wb") as out:
                out.write(payload)
print(f"{len(seen)} seeds")
