"""Checks what the library crate promises about its dependencies (scripts/check-deps.sh):

- a library build pulls in no CLI dependency (clap, indicatif, serde_json) and no nix;
- the workspace's rust-version is the highest minimum any dependency of the library declares.

Reads `cargo metadata --format-version 1` on standard input.
"""

import json
import sys


def version(text: str) -> tuple[int, ...]:
    parts = [int(x) for x in text.split(".")]
    return tuple(parts + [0] * (3 - len(parts)))


def main() -> None:
    meta = json.load(sys.stdin)
    packages = {p["id"]: p for p in meta["packages"]}
    nodes = {n["id"]: n for n in meta["resolve"]["nodes"]}
    root = next(i for i, p in packages.items() if p["name"] == "gpumap" and p["source"] is None)

    # The library's normal (not dev, not build) dependency closure.
    seen: set[str] = set()
    todo = [root]
    while todo:
        for dep in nodes[todo.pop()]["deps"]:
            normal = any(k["kind"] is None for k in dep["dep_kinds"])
            if normal and dep["pkg"] not in seen:
                seen.add(dep["pkg"])
                todo.append(dep["pkg"])
    names = sorted({packages[i]["name"] for i in seen})
    banned = sorted(set(names) & {"clap", "indicatif", "serde_json", "nix"})
    if banned:
        sys.exit(f"check-deps: the library depends on {banned}: they belong to the CLI or tests")

    declared = packages[root]["rust_version"]
    needs = [
        (version(packages[i]["rust_version"]), packages[i]["name"])
        for i in seen
        if packages[i].get("rust_version")
    ]
    highest, who = max(needs, default=((0, 0, 0), "nothing"))
    if version(declared) != highest:
        wanted = ".".join(map(str, highest))
        sys.exit(f"check-deps: rust-version is {declared}, but {who} needs {wanted}")
    print(
        f"check-deps: {len(names)} library dependencies, none of the CLI's; "
        f"rust-version {declared} is the highest any of them declares ({who})"
    )


if __name__ == "__main__":
    main()
