"""A local client of one node, run by deploy_driver.py as a test user (its
uid decides its tenant): the installed python3-kvpool over the installed
libkvpool.so.0. Prints one JSON line.

usage: kv_client.py put|get SOCKET NAMESPACE KEY SIZE SEED
  put: stores SIZE bytes made from SEED under (NAMESPACE, KEY);
  get: reads (NAMESPACE, KEY) and says whether it hit and whether the bytes
  are exactly the SIZE bytes made from SEED.
"""

import json
import os
import random
import sys


def main():
    op, sock, namespace, key, size, seed = sys.argv[1:7]
    size = int(size)
    import kvpool  # after argv: a failed import is reported as such

    want = random.Random(seed).randbytes(size)
    out = {"uid": os.getuid(), "module": kvpool.__file__}
    with kvpool.Client(sock, namespace=namespace, timeout_ms=3000) as c:
        with open("/proc/self/maps") as f:
            libs = {line.split()[-1] for line in f if "libkvpool.so" in line}
        out["library"] = sorted(libs)
        if op == "put":
            (st,) = c.put([key], [want])
            out["status"] = st.name
        elif op == "get":
            (got,) = c.get([key])
            out["hit"] = got is not None
            out["size"] = None if got is None else len(got)
            out["exact"] = got == want
        else:
            raise SystemExit("unknown op " + op)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
