"""The route table of a running vLLM, read from its own OpenAPI document, and what each
route answers with and without a key.

Used by the lab test of the gateway's front door (tests/slow/test_upgrade_under_load.py)
and by hand:
  .venv/bin/python tests/routetable.py http://127.0.0.1:18000 [--via http://127.0.0.1:19000]
prints every route of the instance's /openapi.json with the status it answers keyless,
straight to the instance and (with --via) through the gateway.
"""
import argparse
import json
import re
import urllib.error
import urllib.request

# A path parameter ({response_id}) is filled with this: the route still matches.
PARAM = "gpufleet-probe"


def routes(openapi):
    """[(METHOD, path)] of an OpenAPI document, sorted; path parameters filled."""
    out = []
    for path, methods in (openapi.get("paths") or {}).items():
        for method in methods:
            if method.lower() in ("get", "post", "put", "patch", "delete"):
                out.append((method.upper(), re.sub(r"\{[^}/]*\}", PARAM, path)))
    return sorted(out, key=lambda r: (r[1], r[0]))


def fetch_openapi(base, key=None, timeout=10):
    req = urllib.request.Request(base.rstrip("/") + "/openapi.json")
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read(4 * 2 ** 20))


def status(base, method, path, key=None, timeout=30):
    """The HTTP status a request answers with (0: no answer). POSTs carry an empty JSON
    object: a route that checks the key refuses it before it looks at the body."""
    data = b"{}" if method in ("POST", "PUT", "PATCH") else None
    req = urllib.request.Request(base.rstrip("/") + path, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            resp.read(2 ** 16)
            return resp.status
    except urllib.error.HTTPError as err:
        return err.code
    except (urllib.error.URLError, OSError):
        return 0


def table(table_routes, bases, key=None):
    """{(method, path): {name: status}} for each base URL in `bases` ({name: url})."""
    return {r: {name: status(url, *r, key=key) for name, url in bases.items()} for r in table_routes}


def render(rows, names):
    lines = ["| route | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for (method, path), got in rows.items():
        lines.append(f"| {method} {path} | " + " | ".join(str(got[n]) for n in names) + " |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("instance")
    ap.add_argument("--via", help="the gateway's frontend URL for the same model")
    ap.add_argument("--key", help="send this key (default: none)")
    args = ap.parse_args(argv)
    bases = {"direct": args.instance}
    if args.via:
        bases["gateway"] = args.via
    rows = table(routes(fetch_openapi(args.instance, args.key)), bases, key=args.key)
    print(render(rows, list(bases)))


if __name__ == "__main__":
    main()
