#!/usr/bin/env python3
"""Writes deploy/k8s/nginx.yaml: its ConfigMap holds deploy/nginx/kvtrim.conf verbatim, so that
Kubernetes and deploy/nginx/run_local.sh run the same nginx config. Run after editing that file
(deploy/k8s/check.py fails while they differ)."""
import os

HERE = os.path.dirname(os.path.abspath(__file__))
HEAD = '# nginx in front of the kvtrim StatefulSet (kvtrim.yaml): a ConfigMap with deploy/nginx/kvtrim.conf\n# verbatim (regenerate with deploy/k8s/make_nginx_yaml.py after editing that file; check.py\n# compares them) and the two files it includes, a Deployment of nginx and the Service clients\n# use. Not validated against the Kubernetes schema (no offline schema checker).\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: kvtrim-nginx\ndata:\n  kvtrim_listen.conf: |\n    listen 8080;\n  kvtrim_upstreams.conf: |\n    server kvtrim-0.kvtrim:8080 max_fails=2 fail_timeout=10s;\n    server kvtrim-1.kvtrim:8080 max_fails=2 fail_timeout=10s;\n    server kvtrim-2.kvtrim:8080 max_fails=2 fail_timeout=10s;\n  default.conf: |\n    include /etc/nginx/kvtrim.conf;\n  kvtrim.conf: |\n'
TAIL = '---\napiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: kvtrim-nginx\n  labels: {app: kvtrim-nginx}\nspec:\n  replicas: 2                      # the ring is computed from the same list: every nginx routes a key alike\n  selector:\n    matchLabels: {app: kvtrim-nginx}\n  template:\n    metadata:\n      labels: {app: kvtrim-nginx}\n    spec:\n      containers:\n        - name: nginx\n          image: nginx:1.27\n          ports:\n            - {name: http, containerPort: 8080}\n          readinessProbe:\n            httpGet: {path: /nginx-health, port: http}\n          volumeMounts:\n            - {name: conf, mountPath: /etc/nginx/conf.d/default.conf, subPath: default.conf}\n            - {name: conf, mountPath: /etc/nginx/kvtrim.conf, subPath: kvtrim.conf}\n            - {name: conf, mountPath: /etc/nginx/kvtrim_listen.conf, subPath: kvtrim_listen.conf}\n            - {name: conf, mountPath: /etc/nginx/kvtrim_upstreams.conf, subPath: kvtrim_upstreams.conf}\n      volumes:\n        - name: conf\n          configMap: {name: kvtrim-nginx}\n---\napiVersion: v1\nkind: Service\nmetadata:\n  name: kvtrim-lb\nspec:\n  selector: {app: kvtrim-nginx}\n  ports:\n    - {name: http, port: 80, targetPort: http}\n'


def render():
    conf = open(os.path.join(HERE, "..", "nginx", "kvtrim.conf")).read()
    body = "".join(("    " + l + "\n") if l else "\n" for l in conf.rstrip("\n").split("\n"))
    return HEAD + body + TAIL


if __name__ == "__main__":
    with open(os.path.join(HERE, "nginx.yaml"), "w") as f:
        f.write(render())
