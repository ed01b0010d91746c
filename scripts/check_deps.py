"""Checks what the library crate promises about its dependencies (scripts/check-deps.sh):

- a library build pulls in no CLI dependency (clap, indicatif, serde_json) and no nix;
- the workspace's rust-version is the highest minimum any dependency of the library declares.

"The library" is the core: without its optional `remote` feature (object_store, tokio and
their HTTP and TLS stack), which the CLI and the Python wheel turn on. The workspace resolve
unifies features, so the remote dependencies are left out at the library's own edge; the
rust-version is the highest minimum with them.

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

    remote_only = {
        f.removeprefix("dep:") for f in packages[root]["features"].get("remote", [])
        if f.startswith("dep:")
    }

    def closure(skip_at_root: set[str]) -> set[str]:
        """The library's normal (not dev, not build) dependency closure."""
        seen: set[str] = set()
        todo = [root]
        while todo:
            node = todo.pop()
            for dep in nodes[node]["deps"]:
                normal = any(k["kind"] is None for k in dep["dep_kinds"])
                skipped = node == root and packages[dep["pkg"]]["name"] in skip_at_root
                if normal and not skipped and dep["pkg"] not in seen:
                    seen.add(dep["pkg"])
                    todo.append(dep["pkg"])
        return seen

    seen = closure(remote_only)
    with_remote = closure(set())
    names = sorted({packages[i]["name"] for i in seen})
    banned = sorted(set(names) & {"clap", "indicatif", "serde_json", "nix"})
    if banned:
        sys.exit(f"check-deps: the library depends on {banned}: they belong to the CLI or tests")

    # rust-version: the highest minimum of any dependency, the remote feature's included
    # (docs.rs and the CLI build with it).
    declared = packages[root]["rust_version"]
    needs = [
        (version(packages[i]["rust_version"]), packages[i]["name"])
        for i in with_remote
        if packages[i].get("rust_version")
    ]
    highest, who = max(needs, default=((0, 0, 0), "nothing"))
    if version(declared) != highest:
        wanted = ".".join(map(str, highest))
        sys.exit(f"check-deps: rust-version is {declared}, but {who} needs {wanted}")
    print(
        f"check-deps: {len(names)} library dependencies, none of the CLI's; "
        f"{len(with_remote - seen)} more with the remote feature; rust-version {declared} is "
        f"the highest any of them declares ({who})"
    )


if __name__ == "__main__":
    main()
