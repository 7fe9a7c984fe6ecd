"""Cut the request-body schemas `esqbe engine install-reranker` sends from the engines' official API specifications,
into tests/specs/rerank-requests.strict.schema.json (JSON Schema 2020-12, self-contained $defs), the way
tests/specs/README.md describes for the other cuts: the roots' component schemas and everything they reach, `$ref`s
made local, OpenAPI `nullable` made a type, `oneOf` made `anyOf`, and objects with a fixed property list closed
(`additionalProperties: false` unless the spec says otherwise).

    python scripts/cut_rerank_specs.py ES_SPEC_GIT_DIR OS_SPEC_GIT_DIR > tests/specs/rerank-requests.strict.schema.json

ES_SPEC_GIT_DIR: a git directory of github.com/elastic/elasticsearch-specification (the committed
output/openapi/elasticsearch-serverless-openapi.json is read: the stack file is not committed, see
tests/specs/README.md; `inference.put_custom` is the same operation in both flavours). OS_SPEC_GIT_DIR: one of
github.com/opensearch-project/opensearch-api-specification (spec/namespaces/*.yaml, spec/schemas/*.yaml)."""
from __future__ import annotations

import json
import subprocess
import sys

import yaml

ES_FILE = "output/openapi/elasticsearch-serverless-openapi.json"


def _git(repo: str, *args: str) -> str:
    return subprocess.run(["git", "--git-dir", repo, *args], check=True, capture_output=True, text=True).stdout


def _fix(node, ref):
    """A schema node with its refs rewritten by `ref(target) -> local name`, nullable and oneOf made plain."""
    if isinstance(node, list):
        return [_fix(x, ref) for x in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for k, v in node.items():
        if k == "$ref":
            out[k] = "#/$defs/" + ref(v)
        elif k == "oneOf":
            out["anyOf"] = _fix(v, ref)
        elif k == "discriminator" or k.startswith("x-") and k not in ("x-state", "x-version-added"):
            continue
        else:
            out[k] = _fix(v, ref)
    if out.pop("nullable", False) and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    if out.get("type") == "object" and "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False  # strict: unknown keys refused where the spec lists them
    return out


def cut_es(repo: str) -> tuple[dict, dict, dict]:
    commit = _git(repo, "rev-parse", "HEAD").strip()
    doc = json.loads(_git(repo, "show", f"HEAD:{ES_FILE}"))
    schemas = doc["components"]["schemas"]
    op = doc["paths"]["/_inference/{task_type}/{custom_inference_id}"]["put"]
    root = op["requestBody"]["content"]["application/json"]["schema"]
    defs: dict = {}

    def ref(target: str) -> str:
        short = target.rsplit("/", 1)[1]
        name = f"es:{short}"
        if name not in defs:
            defs[name] = None
            defs[name] = _fix(schemas[short], ref)
        return name

    fixed = _fix(root, ref)
    # the spec models `request` as {"content": "..."}, but its own examples (PutCustomRequestExample1-5) and the
    # reference docs send the template string itself: accept both, and say so
    key = "es:inference._types.CustomRequestParams"
    defs[key] = {"anyOf": [{"type": "string"}, defs[key]]}
    source = {"repository": "https://github.com/elastic/elasticsearch-specification", "branch": "main",
              "commit": commit, "path": ES_FILE, "operation": "inference.put_custom",
              "patches": ["request: string | {content} (the spec's own examples send a string)"]}
    return {"es_inference_put_custom": fixed}, defs, source


def cut_os(repo: str) -> tuple[dict, dict, dict]:
    commit = _git(repo, "rev-parse", "HEAD").strip()
    files: dict[str, dict] = {}

    def load(path: str) -> dict:
        if path not in files:
            files[path] = yaml.safe_load(_git(repo, "show", f"HEAD:spec/{path}"))
        return files[path]

    defs: dict = {}

    def make_ref(base: str):
        def ref(target: str) -> str:
            file, _, pointer = target.partition("#")
            path = base if not file else _join(base, file)
            node = load(path)
            for part in pointer.strip("/").split("/"):
                node = node[part]
            name = f"os:{path.rsplit('/', 1)[-1].removesuffix('.yaml')}:{pointer.rsplit('/', 1)[1]}"
            if name not in defs:
                defs[name] = None
                defs[name] = _fix(node, make_ref(path))
            return name
        return ref

    roots = {}
    for key, path, body in (("os_ml_create_connector", "namespaces/ml.yaml", "ml.create_connector"),
                            ("os_ml_register_model", "namespaces/ml.yaml", "ml.register_model"),
                            ("os_search_pipeline_put", "namespaces/search_pipeline.yaml", "search_pipeline.put")):
        schema = load(path)["components"]["requestBodies"][body]["content"]["application/json"]["schema"]
        roots[key] = _fix(schema, make_ref(path))
    source = {"repository": "https://github.com/opensearch-project/opensearch-api-specification", "branch": "main",
              "commit": commit, "paths": ["spec/namespaces/ml.yaml", "spec/namespaces/search_pipeline.yaml",
                                          "spec/schemas/*.yaml (as reached)"],
              "operations": ["ml.create_connector", "ml.register_model", "search_pipeline.put"], "patches": []}
    return roots, defs, source


def _join(base: str, rel: str) -> str:
    parts = base.split("/")[:-1]
    for p in rel.split("/"):
        if p == "..":
            parts.pop()
        elif p != ".":
            parts.append(p)
    return "/".join(parts)


def main(es_repo: str, os_repo: str) -> None:
    es_roots, es_defs, es_source = cut_es(es_repo)
    os_roots, os_defs, os_source = cut_os(os_repo)
    out = {"$schema": "https://json-schema.org/draft/2020-12/schema",
           "title": "esqbe install-reranker request bodies (strict cut)",
           "x-source": {"elasticsearch": es_source, "opensearch": os_source, "license": "Apache-2.0",
                        "cut_by": "scripts/cut_rerank_specs.py"},
           **es_roots, **os_roots, "$defs": {**es_defs, **os_defs}}
    json.dump(out, sys.stdout, indent=1, sort_keys=False)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main(*sys.argv[1:3])
