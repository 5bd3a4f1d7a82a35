// A gRPC client on Node's @grpc/grpc-js (gRPC in JavaScript, HTTP/2 from Node's http2
// module) for tests/e2e/test_grpc_js_interop.py. It calls an oipserve gRPC port and prints
// one JSON report on stdout; the Python test judges it. Bulky payloads are reported as their
// length and SHA-256, tiny outputs as their values.
//
//   NODE_PATH=<dir>/node_modules node grpc_js_client.js HOST:PORT PROTO_DIR
//
// Packages: @grpc/grpc-js and @grpc/proto-loader, installed by tests/support/grpc_js.py.
"use strict";

const crypto = require("crypto");
const path = require("path");
const grpc = require("@grpc/grpc-js");
const protoLoader = require("@grpc/proto-loader");

const [target, protoDir] = process.argv.slice(2);
// Past gRPC's 4 MiB defaults on both sides, so the 8 MiB calls reach the server.
const LIMIT = 64 * 1024 * 1024;
const LARGE_VALUES = 2 * 1024 * 1024; // FP32 values: 8 MiB
const DEADLINE_MS = 60000;

function loadClient() {
  const definition = protoLoader.loadSync(path.join(protoDir, "grpc_service.proto"), {
    includeDirs: [protoDir],
    keepCase: true,
    longs: String,
    enums: String,
    defaults: true,
    oneofs: true,
  });
  const service = grpc.loadPackageDefinition(definition).inference.GRPCInferenceService;
  return new service(target, grpc.credentials.createInsecure(), {
    "grpc.max_send_message_length": LIMIT,
    "grpc.max_receive_message_length": LIMIT,
  });
}

function deadline() {
  return new Date(Date.now() + DEADLINE_MS);
}

function unary(client, method, request) {
  return new Promise((resolve, reject) => {
    client[method](request, { deadline: deadline() }, (err, reply) =>
      err ? reject(err) : resolve(reply),
    );
  });
}

const CODE_NAMES = Object.fromEntries(Object.entries(grpc.status).map(([k, v]) => [v, k]));

async function failure(promise) {
  try {
    await promise;
    return { code: 0, name: "OK", details: "" };
  } catch (err) {
    return { code: err.code, name: CODE_NAMES[err.code], details: err.details };
  }
}

function simpleRequest(seed) {
  const values = new Int32Array(16).map((_, i) => i * seed);
  const raw = Buffer.from(values.buffer);
  const inputs = ["INPUT0", "INPUT1"].map((name) => ({ name, datatype: "INT32", shape: [1, 16] }));
  return { model_name: "simple", id: `r${seed}`, inputs, raw_input_contents: [raw, raw] };
}

function largeRequest(id) {
  const values = new Float32Array(LARGE_VALUES).map((_, i) => (i % 1021) * 0.25);
  const raw = Buffer.from(values.buffer);
  const inputs = [{ name: "INPUT0", datatype: "FP32", shape: [1, LARGE_VALUES] }];
  return { model_name: "identity_fp32", id, inputs, raw_input_contents: [raw] };
}

function sha256(buffer) {
  return crypto.createHash("sha256").update(buffer).digest("hex");
}

function int32s(buffer) {
  const copy = Buffer.from(buffer); // aligned, whatever the reply buffer's offset
  return Array.from(new Int32Array(copy.buffer, copy.byteOffset, copy.length / 4));
}

// A reply as the report shows it: small int outputs by value, others by length and digest.
function summary(reply) {
  const raw = reply.raw_output_contents || [];
  const out = { id: reply.id, model: reply.model_name, outputs: raw.length };
  if (reply.model_name === "simple") {
    out.output0 = int32s(raw[0]);
  } else if (raw.length) {
    out.bytes = raw[0].length;
    out.sha256 = sha256(raw[0]);
  }
  return out;
}

function stream(client, requests) {
  return new Promise((resolve, reject) => {
    const call = client.ModelStreamInfer({ deadline: deadline() });
    const replies = [];
    call.on("data", (message) =>
      replies.push({
        error: message.error_message,
        reply: message.infer_response ? summary(message.infer_response) : null,
      }),
    );
    call.on("error", reject);
    call.on("status", (status) => resolve({ status: status.code, replies }));
    for (const request of requests) call.write(request);
    call.end();
  });
}

async function main() {
  const client = loadClient();
  const large = largeRequest("big");
  const report = { grpc_js: require("@grpc/grpc-js/package.json").version };
  report.live = (await unary(client, "ServerLive", {})).live;
  report.ready = (await unary(client, "ServerReady", {})).ready;
  const meta = await unary(client, "ModelMetadata", { name: "simple" });
  report.metadata = { name: meta.name, inputs: meta.inputs.map((t) => t.name) };
  report.infer = [];
  for (const seed of [1, 2, 3]) {
    report.infer.push(summary(await unary(client, "ModelInfer", simpleRequest(seed))));
  }
  report.large = {
    sent_bytes: large.raw_input_contents[0].length,
    sent_sha256: sha256(large.raw_input_contents[0]),
    reply: summary(await unary(client, "ModelInfer", large)),
  };
  report.unknown_model = await failure(unary(client, "ModelInfer", { model_name: "nope" }));
  report.unknown_model_ready = await failure(unary(client, "ModelReady", { name: "nope" }));
  const unknown = { ...simpleRequest(9), model_name: "nope", id: "bad" };
  const requests = [simpleRequest(1), large, simpleRequest(2), unknown, simpleRequest(3)];
  report.stream = await stream(client, requests);
  client.close();
  process.stdout.write(JSON.stringify(report) + "\n");
}

main().catch((err) => {
  process.stderr.write(`${err.stack || err}\n`);
  process.exit(1);
});
