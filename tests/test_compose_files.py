"""Static checks of the docker compose files users start (tests/test_engine_integration.py and
tests/test_engine_secured.py start them): localhost-only ports, security off for the plain ones, security and TLS
on for the secured ones."""
from __future__ import annotations

from pathlib import Path

import pytest

DOCKER = Path(__file__).resolve().parents[1] / "docker"
COMPOSE = sorted(p for p in DOCKER.glob("*.yml") if "secured" not in p.name)
SECURED = sorted(DOCKER.glob("*-secured.yml"))


def test_compose_files_exist_for_both_engines_and_topologies():
    names = {p.name for p in COMPOSE}
    assert {"elasticsearch-single-node.yml", "elasticsearch-three-nodes.yml",
            "opensearch-single-node.yml", "opensearch-three-nodes.yml"} <= names


@pytest.mark.parametrize("path", COMPOSE, ids=lambda p: p.name)
def test_compose_files_bind_localhost_with_security_off(path):
    yaml = pytest.importorskip("yaml")
    spec = yaml.safe_load(path.read_text())
    services = spec["services"]
    published = [p for s in services.values() for p in s.get("ports", [])]
    assert len(published) == 1 and published[0].startswith("127.0.0.1:"), published
    for _name, service in services.items():
        env = dict(e.split("=", 1) for e in service["environment"])
        if "elasticsearch" in service["image"]:
            assert env["xpack.security.enabled"] == "false"
            assert "-Xms" in env["ES_JAVA_OPTS"]
        else:
            assert env["DISABLE_SECURITY_PLUGIN"] == "true" and env["DISABLE_INSTALL_DEMO_CONFIG"] == "true"
            assert "-Xms" in env["OPENSEARCH_JAVA_OPTS"]
        if len(services) == 1:
            assert env["discovery.type"] == "single-node"
        else:
            assert len(services) == 3 and "discovery.seed_hosts" in env
            key = "cluster.initial_master_nodes" if "elasticsearch" in service["image"] else "cluster.initial_cluster_manager_nodes"
            assert set(env[key].split(",")) == set(services)


# ------------------------------------------------------------------------------------------------
# the secured compose files (static checks; tests/test_engine_secured.py starts them)


def test_secured_compose_files_exist_for_both_engines():
    assert {p.name for p in SECURED} == {"elasticsearch-secured.yml", "opensearch-secured.yml"}


@pytest.mark.parametrize("path", SECURED, ids=lambda p: p.name)
def test_secured_compose_files_turn_security_and_tls_on(path):
    yaml = pytest.importorskip("yaml")
    import shutil
    import subprocess

    spec = yaml.safe_load(path.read_text())
    services = spec["services"]
    published = [p for s in services.values() for p in s.get("ports", [])]
    assert len(published) == 1 and published[0].startswith("127.0.0.1:"), published
    node = next(s for s in services.values() if s.get("ports"))
    env = dict(e.split("=", 1) for e in node["environment"])
    assert env["discovery.type"] == "single-node"
    # the setup container makes the certificates first; the node starts only after it succeeded
    assert node["depends_on"]["setup"]["condition"] == "service_completed_successfully"
    setup = services["setup"]
    script = DOCKER / "secured" / Path(next(a for a in setup.get("command") or setup.get("entrypoint") if a.endswith(".sh"))).name
    assert script.is_file() and "./secured:/esqbe:ro" in setup["volumes"]
    if shutil.which("bash"):
        assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    text = script.read_text()
    if "elasticsearch" in node["image"]:
        assert env["xpack.security.enabled"] == "true"
        assert env["xpack.security.http.ssl.enabled"] == env["xpack.security.transport.ssl.enabled"] == "true"
        assert env["ELASTIC_PASSWORD"].startswith("${ESQBE_ES_PASSWORD:?")  # no default password
        for key in ("key", "certificate", "certificate_authorities"):
            assert env[f"xpack.security.http.ssl.{key}"] in ("certs/es01/es01.key", "certs/es01/es01.crt", "certs/ca/ca.crt")
        assert "elasticsearch-certutil ca" in text and "elasticsearch-certutil cert" in text and "name: es01" in text
        key_service = services["api-key"]
        assert key_service["depends_on"]["es01"]["condition"] == "service_healthy"
        key_script = (DOCKER / "secured" / "es-api-key.sh").read_text()
        assert '"cluster":[]' in key_script  # least privilege: no cluster privilege, so GET / answers 403
        for privilege in ("create_index", "view_index_metadata", "read", "write", "maintenance"):
            assert f'"{privilege}"' in key_script
    else:
        assert "DISABLE_SECURITY_PLUGIN" not in env and env["DISABLE_INSTALL_DEMO_CONFIG"] == "true"
        assert env["plugins.security.ssl.http.enabled"] == "true"
        assert env["plugins.security.nodes_dn"] == "CN=os01" and '-dname "CN=os01"' in text
        for layer in ("transport", "http"):
            assert env[f"plugins.security.ssl.{layer}.keystore_filepath"] == "esqbe-certs/node.p12"
            assert env[f"plugins.security.ssl.{layer}.truststore_filepath"] == "esqbe-certs/truststore.p12"
        assert "node.p12" in text and "truststore.p12" in text and "hash.sh" in text
        assert "certs:/usr/share/opensearch/config/esqbe-certs" in node["volumes"]
    assert node["healthcheck"]["test"][1].count("--cacert") == 1


