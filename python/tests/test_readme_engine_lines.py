"""The engine command lines the documentation gives (README.md,
docs/connectors.md, deploy/k8s/examples) are checked against the connectors
themselves, so a line a newcomer copies starts the connector it names.

vLLM: the --kv-transfer-config JSON builds the stand-in's KVTransferConfig;
kv_connector_module_path resolves to a module under python/kvpool;
kv_connector is the KVConnectorBase_V1 class that module defines, which
vLLM's factory (stand-in) loads and constructs in the scheduler role; each
kv_connector_extra_config key is one the connector reads (the shared session
settings, their aliases, and the keys vllm.py reads from its extra config);
--disable-hybrid-kv-cache-manager appears only if the connector lacks
SupportsHMA (it has it, so never). A line naming vLLM's LMCache connector
needs LMCACHE_CONFIG_FILE and an LMCache config beside it.

SGLang: --enable-hierarchical-cache and --hicache-storage-backend with the
extra-config JSON; SGLang's dynamic loader (stand-in) loads module_path /
class_name as a HiCacheStorage and constructs it; every key is read by
SGLang's loader or controller or by the backend's settings; interface_v1
only with a layout the backend has a zero-copy path for.

LMCache: the YAML builds the stand-in's LMCacheEngineConfig; each listed
kvpool plugin's module_path / class_name is an adapter (or connector) that
LMCache's adapter registry (stand-in) picks for plugin://<name>; each
remote_storage_plugin.<name>.<setting> is a setting the connector reads.

Each checker returns the problems it found; the negative controls feed it a
wrong copy of a documented line and assert that the copy is refused."""

import ast
import dataclasses
import importlib
import importlib.util
import json
import os
import re
import shlex

import pytest
import yaml

from conftest import PYTHON_DIR, REPO

README = os.path.join(REPO, "README.md")
CONNECTORS_MD = os.path.join(REPO, "docs", "connectors.md")
K8S_EXAMPLES = os.path.join(REPO, "deploy", "k8s", "examples")
KVPOOL_PKG = os.path.join(PYTHON_DIR, "kvpool")

HMA_FLAG = "--disable-hybrid-kv-cache-manager"
# vLLM's own registry name of LMCache's connector (vLLM's kv_connector
# factory.py registers it; kvpool reaches vLLM through it only via LMCache).
VLLM_LMCACHE_CONNECTOR = "LMCacheConnectorV1"


# ---------------------------------------------------------------- extraction

def code_blocks(text):
    """(info string, body) of every fenced code block of a markdown text."""
    return [(m.group(1).strip(), m.group(2))
            for m in re.finditer(r"^```([^\n]*)\n(.*?)^```", text, re.M | re.S)]


def split_commands(body):
    """The shell commands of a block: backslash-newline joins lines, and a
    newline outside quotes ends a command. Each as an argv (comments
    dropped); lines that shlex cannot read are skipped."""
    body = body.replace("\\\n", " ")
    commands, cur, quote = [], [], None
    for ch in body:
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "\n":
            commands.append("".join(cur))
            cur = []
            continue
        cur.append(ch)
    commands.append("".join(cur))
    out = []
    for c in commands:
        try:
            argv = shlex.split(c, comments=True)
        except ValueError:
            continue
        if argv:
            out.append(argv)
    return out


def split_env(argv):
    """Leading NAME=value words as a dict, and the rest of argv."""
    env, i = {}, 0
    while i < len(argv) and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", argv[i]):
        name, _, value = argv[i].partition("=")
        env[name] = value
        i += 1
    return env, argv[i:]


def engine_of(argv):
    if argv[:2] == ["vllm", "serve"]:
        return "vllm"
    if len(argv) >= 3 and argv[0] in ("python", "python3") and argv[1:3] == [
            "-m", "sglang.launch_server"]:
        return "sglang"
    return None


def lmcache_configs(body):
    """The LMCache config files (YAML mappings with remote_storage_plugins)
    written out in a block, one per blank-line separated paragraph."""
    out = []
    for para in re.split(r"\n\s*\n", body):
        try:
            doc = yaml.safe_load(para)
        except yaml.YAMLError:
            continue
        if isinstance(doc, dict) and "remote_storage_plugins" in doc:
            out.append(doc)
    return out


@dataclasses.dataclass
class EngineLine:
    source: str  # file:block number, for messages
    engine: str  # vllm | sglang
    env: dict
    argv: list
    lmcache: list  # LMCache configs written in the same block


def engine_lines_of_markdown(path, text=None):
    if text is None:
        with open(path) as f:
            text = f.read()
    lines = []
    for n, (_, body) in enumerate(code_blocks(text)):
        configs = lmcache_configs(body)
        for argv in split_commands(body):
            env, rest = split_env(argv)
            engine = engine_of(rest)
            if engine:
                lines.append(EngineLine("%s:block %d" % (os.path.relpath(path, REPO), n),
                                        engine, env, rest, configs))
    return lines


def engine_lines_of_pod(path, text=None):
    """A Kubernetes pod example: each container's command and args (an image
    of vLLM's with no command runs `vllm serve`)."""
    if text is None:
        with open(path) as f:
            text = f.read()
    lines = []
    for c in yaml.safe_load(text)["spec"]["containers"]:
        argv = list(c.get("command") or [])
        if not argv and c.get("image", "").startswith("vllm/"):
            argv = ["vllm", "serve"]
        argv += [str(a) for a in c.get("args") or []]
        env = {e["name"]: e.get("value") for e in c.get("env") or []}
        engine = engine_of(argv)
        if engine:
            lines.append(EngineLine(os.path.relpath(path, REPO), engine, env, argv, []))
    return lines


def flag_values(argv, flag):
    out = []
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv):
            out.append(argv[i + 1])
        elif a.startswith(flag + "="):
            out.append(a[len(flag) + 1:])
    return out


# ------------------------------------------------------- what the code reads

def module_source(module_name):
    spec = importlib.util.find_spec(module_name)
    with open(spec.origin) as f:
        return f.read()


def keys_read_from(source, receiver=r"extra"):
    """String keys a module reads from a mapping whose expression matches
    `receiver`: x.get("k", ...), x["k"], x.pop("k"), "k" in x."""
    keys = set()
    rx = re.compile(receiver)
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("get", "pop") and node.args
                and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
                and rx.search(ast.unparse(node.func.value))):
            keys.add(node.args[0].value)
        elif (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant)
              and isinstance(node.slice.value, str) and rx.search(ast.unparse(node.value))):
            keys.add(node.slice.value)
        elif (isinstance(node, ast.Compare) and isinstance(node.left, ast.Constant)
              and isinstance(node.left.value, str) and len(node.ops) == 1
              and isinstance(node.ops[0], ast.In)
              and rx.search(ast.unparse(node.comparators[0]))):
            keys.add(node.left.value)
    return keys


def session_keys(settings_cls=None):
    from kvpool.integrations._session import ALIASES, SessionSettings

    cls = settings_cls or SessionSettings
    return {f.name for f in dataclasses.fields(cls)} | set(ALIASES)


def vllm_extra_keys():
    return session_keys() | keys_read_from(module_source("kvpool.integrations.vllm"))


def sglang_extra_keys():
    from sglang.srt.managers import cache_controller

    loader = keys_read_from(module_source("sglang.srt.mem_cache.storage.backend_factory"))
    controller = keys_read_from(module_source("sglang.srt.managers.cache_controller"))
    return (session_keys() | keys_read_from(module_source("kvpool.integrations.sglang"))
            | loader | controller | set(cache_controller._SGLANG_KEYS))


def lmcache_plugin_settings():
    from kvpool.integrations.lmcache import KvpoolSettings

    # LMCache's plugin loader reads f"remote_storage_plugin.{name}.module_path"
    # and ".class_name" (f-strings, so read from the text).
    loader = set(re.findall(r"remote_storage_plugin\.\{name\}\.(\w+)",
                            module_source("lmcache.v1.storage_backend.connector")))
    return session_keys(KvpoolSettings) | loader


def kvpool_module_file(module_path):
    """The file under python/kvpool a dotted module path names, else None."""
    if not isinstance(module_path, str) or not module_path.startswith("kvpool."):
        return None
    try:
        spec = importlib.util.find_spec(module_path)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    origin = os.path.realpath(spec.origin)
    if not origin.startswith(os.path.realpath(KVPOOL_PKG) + os.sep):
        return None
    return origin


# ------------------------------------------------------------------ checkers

def check_vllm(line):
    from vllm.config import VllmConfig
    from vllm.config.kv_transfer import KVTransferConfig
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (KVConnectorBase_V1,
                                                                   KVConnectorRole, supports_hma)
    from vllm.v1.engine.core import make_kv_cache_config

    problems = []
    values = flag_values(line.argv, "--kv-transfer-config")
    if len(values) != 1:
        return ["%d --kv-transfer-config (want 1)" % len(values)]
    try:
        cfg = json.loads(values[0])
    except ValueError as e:
        return ["--kv-transfer-config is not JSON: %s" % e]
    if not isinstance(cfg, dict):
        return ["--kv-transfer-config is not a JSON object"]
    try:
        ktc = KVTransferConfig(**cfg)
    except (TypeError, ValueError) as e:
        return ["vLLM's KVTransferConfig refuses it: %s" % e]
    if ktc.kv_connector == VLLM_LMCACHE_CONNECTOR and not ktc.kv_connector_module_path:
        if "LMCACHE_CONFIG_FILE" not in line.env:
            problems.append("LMCache's connector without LMCACHE_CONFIG_FILE")
        if not line.lmcache:
            problems.append("LMCache's connector with no LMCache config beside it")
        for c in line.lmcache:
            problems += check_lmcache_config(c)
        return problems

    path = ktc.kv_connector_module_path
    module_file = kvpool_module_file(path)
    if module_file is None:
        return problems + ["kv_connector_module_path %r is no module under python/kvpool" % path]
    module = importlib.import_module(path)
    defined = sorted(n for n, v in vars(module).items()
                     if isinstance(v, type) and issubclass(v, KVConnectorBase_V1)
                     and v.__module__ == module.__name__)
    if ktc.kv_connector not in defined:
        return problems + ["kv_connector %r is not a connector class of %s (it defines %s)"
                           % (ktc.kv_connector, path, defined)]
    cls = KVConnectorFactory.get_connector_class(ktc)
    hma = supports_hma(cls)
    if HMA_FLAG in line.argv and hma:
        problems.append("%s: not needed, %s implements SupportsHMA" % (HMA_FLAG, cls.__name__))
    if HMA_FLAG not in line.argv and not hma:
        problems.append("%s is needed: %s lacks SupportsHMA" % (HMA_FLAG, cls.__name__))

    extra = ktc.kv_connector_extra_config
    if not isinstance(extra, dict):
        return problems + ["kv_connector_extra_config is not an object"]
    known = vllm_extra_keys()
    for key in sorted(set(extra) - known):
        problems.append("kv_connector_extra_config key %r is not read by %s" % (key, path))
    if problems:
        return problems
    # vLLM's factory builds it (scheduler role: no connection yet), which
    # also parses every setting's value.
    vllm_config = VllmConfig(kv_transfer_config=ktc)
    try:
        connector = KVConnectorFactory.create_connector(
            vllm_config, KVConnectorRole.SCHEDULER, make_kv_cache_config(vllm_config, 16),
            hybrid_kv_cache_manager=HMA_FLAG not in line.argv)
    except (TypeError, ValueError) as e:
        return ["vLLM's factory cannot build the connector: %s" % e]
    connector.shutdown()
    return problems


def check_sglang(line):
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
    from sglang.srt.mem_cache.storage import StorageBackendFactory
    from sglang.srt.managers import cache_controller

    problems = []
    if "--enable-hierarchical-cache" not in line.argv:
        problems.append("no --enable-hierarchical-cache (HiCache storage needs it)")
    backends = flag_values(line.argv, "--hicache-storage-backend")
    configs = flag_values(line.argv, "--hicache-storage-backend-extra-config")
    if len(backends) != 1 or len(configs) != 1:
        return problems + ["want one --hicache-storage-backend and one extra config, not %d, %d"
                           % (len(backends), len(configs))]
    try:
        extra = json.loads(configs[0])
    except ValueError as e:
        return problems + ["--hicache-storage-backend-extra-config is not JSON: %s" % e]
    if not isinstance(extra, dict):
        return problems + ["the extra config is not a JSON object"]
    for key in sorted(set(extra) - sglang_extra_keys()):
        problems.append("extra-config key %r is read neither by SGLang nor by the backend" % key)
    module_path = extra.get("module_path")
    if kvpool_module_file(module_path) is None:
        problems.append("module_path %r is no module under python/kvpool" % (module_path,))
    if not isinstance(extra.get("backend_name"), str) or not extra.get("backend_name"):
        problems.append("backend_name is not a name")
    if extra.get("interface_v1"):
        from kvpool.integrations import sglang as backend_module

        layouts = flag_values(line.argv, "--hicache-mem-layout")
        if not layouts or layouts[-1] not in backend_module._ZERO_COPY_LAYOUTS:
            problems.append("interface_v1 with --hicache-mem-layout %s: no zero-copy path (%s)"
                            % (layouts, ", ".join(backend_module._ZERO_COPY_LAYOUTS)))
    if problems:
        return problems
    # SGLang's controller pops its own keys, then the loader builds the class.
    backend_extra = {k: v for k, v in extra.items() if k not in cache_controller._SGLANG_KEYS}
    config = HiCacheStorageConfig(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0,
                                  attn_cp_size=1, is_mla_model=False,
                                  enable_storage_metrics=False, is_page_first_layout=True,
                                  model_name="m", extra_config=backend_extra)
    try:
        backend = StorageBackendFactory.create_backend(backends[0], config, None)
    except (ImportError, TypeError, ValueError) as e:
        return ["SGLang cannot build the backend: %s" % e]
    try:
        if type(backend).__name__ != extra["class_name"] or \
                type(backend).__module__ != module_path:
            problems.append("SGLang built %r, not %s.%s" % (backend, module_path,
                                                            extra["class_name"]))
    finally:
        backend.close()
    return problems


def check_lmcache_config(cfg):
    from lmcache.v1.config import LMCacheEngineConfig
    from lmcache.v1.storage_backend.connector import ConnectorManager, DynamicConnectorAdapter

    from kvpool.integrations import lmcache as connector_module

    problems = []
    try:
        config = LMCacheEngineConfig(**cfg)
    except TypeError as e:
        return ["LMCache's config refuses it: %s" % e]
    plugins = [p for p in config.remote_storage_plugins or []
               if p.split(".", 1)[0] == connector_module.PLUGIN_TYPE]
    if not plugins:
        return ["no remote_storage_plugins entry of type %r" % connector_module.PLUGIN_TYPE]
    extra = config.extra_config or {}
    settings = lmcache_plugin_settings()
    for key in sorted(extra):
        if not key.startswith("remote_storage_plugin."):
            continue
        rest = key[len("remote_storage_plugin."):]
        name = next((p for p in sorted(config.remote_storage_plugins or [], key=len, reverse=True)
                     if rest.startswith(p + ".")), None)
        if name is None:
            problems.append("%s: for a plugin that remote_storage_plugins does not list" % key)
        elif rest[len(name) + 1:] not in settings:
            problems.append("%s: %r is not a setting the connector reads"
                            % (key, rest[len(name) + 1:]))
    for name in plugins:
        module_path = extra.get("remote_storage_plugin.%s.module_path" % name)
        if kvpool_module_file(module_path) is None:
            problems.append("plugin %s: module_path %r is no module under python/kvpool"
                            % (name, module_path))
            continue
        url = "plugin://%s" % name
        try:
            manager = ConnectorManager(url, None, None, config)
        except (ImportError, AttributeError, TypeError, ValueError) as e:
            problems.append("plugin %s: LMCache cannot load it: %s" % (name, e))
            continue
        # The first adapter that accepts the URL, as LMCache picks it.
        adapter = next((a for a in manager.adapters if a.can_parse(url)), None)
        if adapter is None:
            chosen = None
        elif isinstance(adapter, DynamicConnectorAdapter):
            chosen = adapter.connector_cls
        else:
            chosen = type(adapter)
        if chosen is None or chosen.__module__ != connector_module.__name__:
            problems.append("plugin %s: LMCache picks %r for %s, not kvpool's" % (name, chosen,
                                                                                url))
            continue
        try:
            connector_module.resolve_settings(url, name, config)
        except (TypeError, ValueError) as e:
            problems.append("plugin %s: a setting's value is refused: %s" % (name, e))
    return problems


CHECKERS = {"vllm": check_vllm, "sglang": check_sglang}


def check(line):
    return CHECKERS[line.engine](line)


# ---------------------------------------------------------------- the lines

def readme_lines(text=None):
    return engine_lines_of_markdown(README, text)


def connectors_lines(text=None):
    return engine_lines_of_markdown(CONNECTORS_MD, text)


def pod_lines():
    out = []
    for name in sorted(os.listdir(K8S_EXAMPLES)):
        if name.endswith(".yaml"):
            out += engine_lines_of_pod(os.path.join(K8S_EXAMPLES, name))
    return out


def uses_kvpool_connector(line):
    return line.engine == "vllm" and "KvpoolConnector" in " ".join(line.argv)


def uses_lmcache(line):
    return line.engine == "vllm" and VLLM_LMCACHE_CONNECTOR in " ".join(line.argv)


def read(path):
    with open(path) as f:
        return f.read()


@pytest.fixture(autouse=True)
def _standins(standins_on_path):
    """The engines' stand-ins under their real names (conftest)."""


def test_the_documents_have_the_engine_lines():
    # The extraction finds what the checks below are about, so they cannot
    # pass by finding nothing.
    readme = readme_lines()
    assert [l.engine for l in readme] == ["vllm"] and uses_kvpool_connector(readme[0])
    docs = connectors_lines()
    assert sum(uses_kvpool_connector(l) for l in docs) == 1
    assert sum(uses_lmcache(l) for l in docs) == 1
    assert sum(l.engine == "sglang" for l in docs) == 1
    assert all(len(l.lmcache) == 1 for l in docs if uses_lmcache(l))
    assert sorted(l.engine for l in pod_lines()) == ["sglang", "vllm"]


@pytest.mark.parametrize("line", readme_lines() + connectors_lines() + pod_lines(),
                         ids=lambda l: "%s:%s" % (l.source, l.engine))
def test_documented_engine_line_matches_the_connector(line):
    assert check(line) == []


def test_readme_vllm_line_is_the_one_connectors_md_gives():
    def transfer_config(line):
        return json.loads(flag_values(line.argv, "--kv-transfer-config")[0])

    (readme,) = readme_lines()
    (docs,) = [l for l in connectors_lines() if uses_kvpool_connector(l)]
    assert transfer_config(readme) == transfer_config(docs)
    assert readme.argv[:2] == docs.argv[:2] and HMA_FLAG not in readme.argv


def test_documented_settings_tables_are_read_by_the_connectors():
    """docs/connectors.md's per-connector tables name only keys the code reads."""
    text = read(CONNECTORS_MD)

    def table_keys(section):
        body = text.split("\n## %s\n" % section, 1)[1].split("\n## ", 1)[0]
        keys = set()
        for row in re.findall(r"^\| (`[^|]*)\|", body, re.M):
            keys |= set(re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", row))
        return keys

    vllm_keys = table_keys("vLLM")
    assert {"layerwise", "use_layerwise", "load_async_min_tokens", "kv_events",
            "event_medium"} <= vllm_keys
    assert vllm_keys <= vllm_extra_keys(), vllm_keys - vllm_extra_keys()
    sglang_keys = table_keys("SGLang HiCache")
    assert {"backend_name", "module_path", "class_name", "interface_v1"} <= sglang_keys
    assert sglang_keys <= sglang_extra_keys(), sglang_keys - sglang_extra_keys()
    lmcache_keys = table_keys("LMCache")
    assert lmcache_keys == {"io_threads"} and lmcache_keys <= lmcache_plugin_settings()
    shared = table_keys("Connector settings and faults")
    assert shared == session_keys(), shared ^ session_keys()


# --------------------------------------------------------- negative controls

def mutated(lines_of, path, old, new, pick):
    """The lines of `path` with `old` replaced by `new` (which must change
    the text), narrowed by `pick`: exactly one."""
    text = read(path)
    assert old in text, old
    changed = text.replace(old, new, 1)
    assert changed != text
    (line,) = [l for l in lines_of(changed) if pick(l)]
    return line


README_VLLM = [
    # The flag the connector does not need, put back where it was.
    ("vllm serve MODEL --kv-transfer-config", "vllm serve MODEL %s --kv-transfer-config"
     % HMA_FLAG, "not needed"),
    ('"kv_connector": "KvpoolConnector"', '"kv_connector": "KvpoolConnectorV1"',
     "not a connector class"),
    ('"kv_connector_module_path": "kvpool.integrations.vllm"',
     '"kv_connector_module_path": "kvpool.integration.vllm"', "no module under"),
    ('"kv_connector_module_path": "kvpool.integrations.vllm"',
     '"kv_connector_module_path": "vllm.distributed.kv_transfer.kv_connector.factory"',
     "no module under"),
    ('"kv_connector_module_path": "kvpool.integrations.vllm"',
     '"kv_connector_module_path": "kvpool.integrations.sglang"', "not a connector class"),
    ('{"socket": "/run/kvpool/kvpool.sock"}', '{"kvpool_sockets": "/run/kvpool/kvpool.sock"}',
     "'kvpool_sockets' is not read"),
    ('{"socket": "/run/kvpool/kvpool.sock"}',
     '{"socket": "/run/kvpool/kvpool.sock", "timeout_ms": 0}', "cannot build"),
    ('"kv_role": "kv_both"', '"kv_role": "both"', "KVTransferConfig refuses"),
    ('"kv_role": "kv_both"', '"kv_rol": "kv_both"', "KVTransferConfig refuses"),
    ('"kv_role": "kv_both",', '"kv_role": "kv_both"', "not JSON"),
]


@pytest.mark.parametrize("old,new,why", README_VLLM, ids=[c[2] for c in README_VLLM])
def test_a_wrong_readme_vllm_line_is_refused(old, new, why):
    line = mutated(readme_lines, README, old, new, lambda l: l.engine == "vllm")
    problems = check(line)
    assert any(why in p for p in problems), problems


def test_a_connector_without_hma_needs_the_flag(monkeypatch):
    # The other direction of the HMA rule: were the connector without
    # SupportsHMA, the README's line (no flag) would be refused.
    from vllm.distributed.kv_transfer.kv_connector.v1 import base

    monkeypatch.setattr(base, "supports_hma", lambda connector: False)
    (line,) = readme_lines()
    problems = check_vllm(line)
    assert any("is needed" in p for p in problems), problems


SGLANG = [
    ("--hicache-storage-backend dynamic", "--hicache-storage-backend kvpool", "cannot build"),
    ('"class_name": "KvpoolHiCacheStorage"', '"class_name": "KvpoolStorage"', "cannot build"),
    ('"class_name": "KvpoolHiCacheStorage"', '"class_name": "SessionSettings"', "cannot build"),
    ('"module_path": "kvpool.integrations.sglang"', '"module_path": "kvpool.integrations.sglan"',
     "no module under"),
    ('"interface_v1": 1', '"interface_v1": 1, "zero_copy": 1', "'zero_copy' is read neither"),
    ("--hicache-mem-layout page_first ", "--hicache-mem-layout layer_first ", "no zero-copy"),
    ("--page-size 64 --enable-hierarchical-cache", "--page-size 64", "hierarchical"),
    ('"socket": "/run/kvpool/kvpool.sock"}', '"socket": "/run/kvpool/kvpool.sock",}',
     "not JSON"),
]


@pytest.mark.parametrize("old,new,why", SGLANG, ids=[c[2] for c in SGLANG])
def test_a_wrong_sglang_line_is_refused(old, new, why):
    line = mutated(connectors_lines, CONNECTORS_MD, old, new, lambda l: l.engine == "sglang")
    problems = check(line)
    assert any(why in p for p in problems), problems


LMCACHE = [
    ("class_name: KvpoolConnectorAdapter", "class_name: KvpoolAdapter", "cannot load"),
    ("class_name: KvpoolConnectorAdapter", "class_name: Session", "cannot load"),
    ("module_path: kvpool.integrations.lmcache", "module_path: kvpool.integrations.lmcach",
     "no module under"),
    ("remote_storage_plugin.kvpool.socket:", "remote_storage_plugin.kvpool.sock:",
     "'sock' is not a setting"),
    ('remote_storage_plugins: ["kvpool"]', 'remote_storage_plugins: ["kvpol"]',
     "no remote_storage_plugins entry"),
    ('remote_storage_plugins: ["kvpool"]', 'remote_storage_plugins: ["kvpool", "kvpool.b"]',
     "cannot load"),
    ("chunk_size: 256", "chunk_sizes: 256", "config refuses"),
    ("LMCACHE_CONFIG_FILE=lmcache.yaml vllm serve", "vllm serve", "LMCACHE_CONFIG_FILE"),
]


@pytest.mark.parametrize("old,new,why", LMCACHE, ids=[c[2] for c in LMCACHE])
def test_a_wrong_lmcache_config_is_refused(old, new, why):
    line = mutated(connectors_lines, CONNECTORS_MD, old, new, uses_lmcache)
    problems = check(line)
    assert any(why in p for p in problems), problems


def test_extraction_sees_a_line_that_is_not_fenced_as_sh():
    # The docs' blocks have no info string; README's are ```sh. Both count.
    blocks = code_blocks(read(CONNECTORS_MD)) + code_blocks(read(README))
    infos = {info for info, body in blocks if "vllm serve" in body}
    assert infos == {"", "sh"}
