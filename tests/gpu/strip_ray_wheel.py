"""Repack a Ray wheel without what ``kernel-lsp sweep --engine ray`` never loads, so it fits the GPU machine's carry.

Ray's manylinux wheel is about 79 MB, over the 64 MiB a device call may carry; a third of it is the Java
jar. Dropped: the Java jar, the dashboard's web UI, and Ray's libraries (Data, Train, Tune, Serve, RLlib,
LLM); kept: the core (``ray.init``, tasks, the raylet and GCS binaries). About 39 MB remain. The same
folders are dropped from ``RECORD``.

    python3 tests/gpu/strip_ray_wheel.py ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl .whl/ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl
"""

import sys
import zipfile

DROP = ("ray/jars/", "ray/dashboard/client/", "ray/rllib/", "ray/serve/", "ray/tune/", "ray/train/", "ray/data/", "ray/llm/")


def main(src: str, dst: str) -> None:
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zout:
        for info in zin.infolist():
            if info.filename.startswith(DROP):
                continue
            data = zin.read(info.filename)
            if info.filename.endswith(".dist-info/RECORD"):
                data = b"".join(line for line in data.splitlines(keepends=True) if not line.decode().startswith(DROP))
            zout.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
