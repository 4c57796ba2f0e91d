#!/usr/bin/env python3
"""Checks deploy/k8s/*.yaml without a cluster: every document parses as YAML (PyYAML) and has
apiVersion, kind and metadata.name; nginx.yaml's ConfigMap holds deploy/nginx/kvtrim.conf
verbatim and one upstream server line per replica of the kvtrim StatefulSet; the probes point
at /health (readiness) and /livez (liveness). Not a schema validation: no Kubernetes schema
checker installs offline. Exit 77 (skip) without PyYAML."""
import glob
import os
import sys

try:
    import yaml
except ImportError:
    print("SKIP: PyYAML is not installed (python3-yaml)")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_nginx_yaml  # noqa: E402

errors = []
docs = {}
for path in sorted(glob.glob(os.path.join(HERE, "*.yaml"))):
    for d in yaml.safe_load_all(open(path)):
        if d is None:
            continue
        for k in ("apiVersion", "kind", "metadata"):
            if k not in d:
                errors.append(f"{os.path.basename(path)}: a document without {k}")
        docs[(d.get("kind"), d.get("metadata", {}).get("name"))] = d

cm = docs.get(("ConfigMap", "kvtrim-nginx"))
sts = docs.get(("StatefulSet", "kvtrim"))
if not cm or not sts:
    errors.append("missing the ConfigMap kvtrim-nginx or the StatefulSet kvtrim")
else:
    if open(os.path.join(HERE, "nginx.yaml")).read() != make_nginx_yaml.render():
        errors.append("nginx.yaml is not deploy/nginx/kvtrim.conf's: run deploy/k8s/make_nginx_yaml.py")
    if cm["data"]["kvtrim.conf"] != open(os.path.join(HERE, "..", "nginx", "kvtrim.conf")).read():
        errors.append("the ConfigMap's kvtrim.conf differs from deploy/nginx/kvtrim.conf")
    servers = [l for l in cm["data"]["kvtrim_upstreams.conf"].splitlines() if l.strip().startswith("server ")]
    if len(servers) != sts["spec"]["replicas"]:
        errors.append(f"{len(servers)} upstream servers for {sts['spec']['replicas']} replicas")
    c = sts["spec"]["template"]["spec"]["containers"][0]
    if c["readinessProbe"]["httpGet"]["path"] != "/health":
        errors.append("the readiness probe is not /health")
    if c["livenessProbe"]["httpGet"]["path"] != "/livez":
        errors.append("the liveness probe is not /livez")
for e in errors:
    print("FAIL:", e)
print(f"deploy/k8s: {len(docs)} documents parsed, {len(errors)} problems")
sys.exit(1 if errors else 0)
