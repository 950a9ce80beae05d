// Ajv's verdicts on the JSON Schema exports, for tests/test_export_engines.py.
//
// Reads one JSON document on standard input:
//   {"cases": [{"name": N, "schema": S, "instances": [I, ...]}, ...]}
// compiles each schema with Ajv's JSON Schema 2020-12 class in strict mode, with ECMA-262
// patterns in unicode ("u") mode, and writes on standard output
//   {"cases": [{"name": N, "error": null | "why it did not compile",
//               "valid": [true | false, ...]}, ...]}
// one verdict per instance, in order. Exits 0 whenever it could read its input.
import Ajv2020 from "ajv/dist/2020.js";

const chunks = [];
for await (const chunk of process.stdin) chunks.push(chunk);
const input = JSON.parse(Buffer.concat(chunks).toString("utf8"));

const results = [];
for (const { name, schema, instances } of input.cases) {
  const ajv = new Ajv2020({
    strict: true,
    // (an approximated list, spec/llm.md §4, is an open tuple: prefixItems with "items" for
    // the rest and a "minItems"; strictTuples, a lint against tuples left open by mistake,
    // would refuse it)
    strictTuples: false,
    unicodeRegExp: true,
    allErrors: false,
  });
  let validate;
  try {
    validate = ajv.compile(schema);
  } catch (error) {
    results.push({ name, error: String(error && error.message || error), valid: [] });
    continue;
  }
  results.push({ name, error: null, valid: instances.map((instance) => validate(instance) === true) });
}
process.stdout.write(JSON.stringify({ cases: results }));
