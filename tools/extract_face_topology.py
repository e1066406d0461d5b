"""Write stream/assets/face_mesh_topology.json from the pinned mediapipe wheel.

The Face Mesh triangulation and contour rings are data (Apache-2.0, MediaPipe authors) in the wheel's
`face_mesh_connections.py`. We parse that file as text with `ast`, never importing mediapipe, and
commit the result so that the swapper needs nothing from the wheel at run time.

    python tools/extract_face_topology.py [--wheel mediapipe-0.10.21-*.whl]
"""

from __future__ import annotations

import argparse
import ast
import json
import tempfile
import zipfile
from collections import defaultdict
from pathlib import Path

from swapstream.engines.builtin import MEDIAPIPE_VERSION, download_mediapipe_wheel

MEMBER = "mediapipe/python/solutions/face_mesh_connections.py"
OUT = Path(__file__).resolve().parents[1] / "stream" / "assets" / "face_mesh_topology.json"


def edge_lists(source: str) -> dict[str, list[tuple[int, int]]]:
    """Each `NAME = frozenset([...])` assignment as its ordered list of edges."""
    out: dict[str, list[tuple[int, int]]] = {}
    for node in ast.parse(source).body:
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and node.value.args
                and isinstance(node.value.args[0], ast.List)):
            out[node.targets[0].id] = [tuple(e) for e in ast.literal_eval(node.value.args[0])]
    return out


def rings(edges: list[tuple[int, int]]) -> list[list[int]]:
    """Split an edge set into closed loops, each as an ordered list of vertex indices."""
    adj: dict[int, list[int]] = defaultdict(list)
    for a, b in edges:
        adj[a].append(b)
        adj[b].append(a)
    seen: set[int] = set()
    loops = []
    for start in sorted(adj):
        if start in seen:
            continue
        loop, prev, cur = [start], None, start
        seen.add(start)
        while True:
            nxt = [n for n in adj[cur] if n != prev]
            if not nxt or nxt[0] == start:
                break
            prev, cur = cur, nxt[0]
            if cur in seen:
                break
            loop.append(cur)
            seen.add(cur)
        loops.append(loop)
    return loops


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wheel", type=Path, help="a local mediapipe wheel (default: download it)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        wheel = args.wheel or download_mediapipe_wheel(Path(tmp))
        source = zipfile.ZipFile(wheel).read(MEMBER).decode()
    e = edge_lists(source)
    tes = e["FACEMESH_TESSELATION"]
    tris = []
    for i in range(0, len(tes), 3):
        (a, b), (b2, c), (c2, a2) = tes[i:i + 3]
        assert b == b2 and c == c2 and a == a2, f"edges {i}..{i + 2} are not one triangle"
        tris.append([a, b, c])
    lips = rings(e["FACEMESH_LIPS"])
    outer = next(r for r in lips if 61 in r)
    inner = next(r for r in lips if 78 in r)
    topo = {
        "source": f"mediapipe=={MEDIAPIPE_VERSION} {MEMBER}",
        "licence": "Apache-2.0, Copyright 2021 The MediaPipe Authors",
        "num_landmarks": 468,
        "triangles": tris,
        "face_oval": rings(e["FACEMESH_FACE_OVAL"])[0],
        "lips_outer": outer,
        "lips_inner": inner,
        # MediaPipe names eyes from the subject's point of view: its RIGHT eye is on the image left.
        "image_left_eye": rings(e["FACEMESH_RIGHT_EYE"])[0],
        "image_right_eye": rings(e["FACEMESH_LEFT_EYE"])[0],
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(topo, separators=(",", ":")) + "\n")
    print(f"wrote {OUT}: {len(tris)} triangles")


if __name__ == "__main__":
    main()
