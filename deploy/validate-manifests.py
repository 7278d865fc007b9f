#!/usr/bin/env python3
"""Validate rendered chart output strictly.

Kubernetes kinds go to `kubernetes-validate --strict` for one Kubernetes
version (a kind it has no schema for is an error, not a warning); the custom
resources the chart renders (KEDA ScaledObject, ServiceMonitor) are checked
against the JSON schemas kept in deploy/schemas/. With --prefix, the
ScaledObject's stream and consumer must be the names the binaries derive
from that NATS prefix.

usage: validate-manifests.py RENDERED.yaml --k8s 1.30.0 [--prefix PREFIX]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import jsonschema
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
CUSTOM = {
    ("keda.sh/v1alpha1", "ScaledObject"): "keda-scaledobject-v1alpha1.json",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitor-v1.json",
}


def task_names(prefix):
    """The stream and durable consumer names of bus/src/nats.rs."""
    return prefix.replace(".", "_").replace("-", "_").upper() + "_TASKS", prefix + "-workers"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("rendered")
    ap.add_argument("--k8s", default="1.30.0")
    ap.add_argument("--prefix")
    ap.add_argument("--kubernetes-validate", default="kubernetes-validate")
    a = ap.parse_args()
    with open(a.rendered) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    errors = []
    builtin = []
    scaled = []
    for d in docs:
        key = (d.get("apiVersion"), d.get("kind"))
        name = f'{d.get("kind")}/{d.get("metadata", {}).get("name")}'
        if key in CUSTOM:
            with open(os.path.join(HERE, "schemas", CUSTOM[key])) as f:
                schema = json.load(f)
            v = jsonschema.Draft202012Validator(schema)
            for e in v.iter_errors(d):
                errors.append(f"{name}: {'/'.join(map(str, e.absolute_path))}: {e.message}")
            if key[1] == "ScaledObject":
                scaled.append(d)
        else:
            builtin.append(d)
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump_all(builtin, f)
        path = f.name
    try:
        out = subprocess.run(
            [a.kubernetes_validate, "--strict", "-k", a.k8s, path],
            capture_output=True, text=True,
        )
    finally:
        os.unlink(path)
    lines = (out.stdout + out.stderr).splitlines()
    passed = [l for l in lines if l.startswith("INFO") and " passed " in l]
    bad = [l for l in lines if not (l.startswith("INFO") and " passed " in l) and l.strip()]
    if out.returncode != 0 or bad:
        errors.extend(l.replace(path, a.rendered) for l in bad)
        if out.returncode != 0 and not bad:
            errors.append(f"kubernetes-validate exited {out.returncode}")
    if len(passed) != len(builtin):
        errors.append(f"kubernetes-validate passed {len(passed)} of {len(builtin)} resources")
    if a.prefix is not None:
        stream, consumer = task_names(a.prefix)
        for d in scaled:
            for t in d["spec"]["triggers"]:
                if t["type"] != "nats-jetstream":
                    continue
                m = t["metadata"]
                if (m.get("stream"), m.get("consumer")) != (stream, consumer):
                    errors.append(
                        f"ScaledObject trigger watches {m.get('stream')}/{m.get('consumer')}, "
                        f"the workers use {stream}/{consumer}"
                    )
    if errors:
        for e in errors:
            print(f"  FAIL {e}", file=sys.stderr)
        sys.exit(1)
    print(f"  ok: {len(builtin)} resources valid for Kubernetes {a.k8s} (strict), "
          f"{len(docs) - len(builtin)} custom resources valid against deploy/schemas")


if __name__ == "__main__":
    main()
