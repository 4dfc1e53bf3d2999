// Validates Kubernetes manifests against the API's schemas, offline.
// usage: node check.mjs FILE.yaml...   (exit 0: all valid; 1: not; 2: usage)
//
// Each YAML document is checked twice:
//  1. against the compiled JSON schema of its apiVersion and kind from the
//     npm packages kubernetes-models (core, apps) and
//     @kubernetes-models/prometheus-operator (ServiceMonitor): types,
//     required fields, formats and enums;
//  2. against the same packages' TypeScript definitions (tsc, strict): the
//     schemas let fields they do not know through, the type definitions do
//     not, so a misspelt or misplaced field fails here.
// An apiVersion/kind not in KINDS below is an error: nothing passes
// unchecked.
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import YAML from "yaml";

import * as core from "kubernetes-models/v1";
import * as apps from "kubernetes-models/apps/v1";
import * as monitoring from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1";

const HERE = path.dirname(fileURLToPath(import.meta.url));
// apiVersion -> [runtime module, module name for the type definitions]
const KINDS = {
  "v1": [core, "kubernetes-models/v1"],
  "apps/v1": [apps, "kubernetes-models/apps/v1"],
  "monitoring.coreos.com/v1": [monitoring,
    "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1"],
};

const files = process.argv.slice(2);
if (files.length === 0) {
  console.error("usage: node check.mjs FILE.yaml...");
  process.exit(2);
}

let bad = 0;
const docs = [];  // {where, apiVersion, kind, obj}
for (const file of files) {
  const text = fs.readFileSync(file, "utf8");
  for (const doc of YAML.parseAllDocuments(text)) {
    if (doc.errors.length > 0) {
      console.error(`FAIL ${file}: YAML: ${doc.errors[0].message}`);
      bad++;
      continue;
    }
    const obj = doc.toJSON();
    if (obj === null || obj === undefined) continue;  // an empty document
    const where = `${file}: ${obj.kind}/${obj.metadata?.name}`;
    const known = KINDS[obj.apiVersion];
    const Model = known?.[0]?.[obj.kind];
    if (Model === undefined) {
      console.error(`FAIL ${where}: no schema for ${obj.apiVersion} ${obj.kind}`);
      bad++;
      continue;
    }
    try {
      new Model(obj).validate();
    } catch (e) {
      console.error(`FAIL ${where}: ${e.message}`);
      bad++;
      continue;
    }
    docs.push({ where, apiVersion: obj.apiVersion, kind: obj.kind, obj });
  }
}

// 2. The type definitions: one generated module, type-checked, no output.
const gen = fs.mkdtempSync(path.join(HERE, ".gen-"));
try {
  let ts = "";
  const lines = [];  // [first line, last line, where] per document
  docs.forEach((d, i) => {
    const first = ts.split("\n").length;
    ts += `import type { I${d.kind} as T${i} } from "${KINDS[d.apiVersion][1]}";\n`;
    ts += `export const doc${i}: T${i} = ${JSON.stringify(d.obj, null, 2)};\n`;
    lines.push([first, ts.split("\n").length - 1, d.where]);
  });
  fs.writeFileSync(path.join(gen, "manifests.ts"), ts);
  fs.writeFileSync(path.join(gen, "tsconfig.json"), JSON.stringify({
    compilerOptions: {
      strict: true, noEmit: true, module: "nodenext", moduleResolution: "nodenext",
      skipLibCheck: true, types: [],
    },
    files: ["manifests.ts"],
  }));
  const tsc = path.join(HERE, "node_modules", ".bin", "tsc");
  try {
    execFileSync(tsc, ["-p", gen, "--pretty", "false"], { encoding: "utf8", stdio: "pipe" });
  } catch (e) {
    const out = `${e.stdout ?? ""}${e.stderr ?? ""}`;
    for (const line of out.split("\n").filter((l) => l.trim() !== "")) {
      const m = line.match(/manifests\.ts\((\d+),\d+\): (.*)$/);
      const doc = m && lines.find(([a, b]) => +m[1] >= a && +m[1] <= b);
      console.error(doc ? `FAIL ${doc[2]}: ${m[2]}` : `FAIL tsc: ${line}`);
      bad++;
    }
    if (out.trim() === "") {
      console.error(`FAIL tsc: ${e.message}`);
      bad++;
    }
  }
} finally {
  fs.rmSync(gen, { recursive: true, force: true });
}

if (bad === 0) {
  for (const d of docs) console.log(`OK   ${d.where}`);
  console.log(`${docs.length} documents valid`);
}
process.exit(bad === 0 ? 0 : 1);
