// The closed literal unions of js/index.d.ts hold exactly the codes the Rust crates emit: a
// code added to or removed from one side only fails here, naming it.
import assert from 'node:assert/strict'
import { readFileSync } from 'node:fs'
import { test } from 'node:test'
import { fileURLToPath } from 'node:url'

import { typeCheck } from './helpers.mjs'

const read = (path) => readFileSync(new URL(`../${path}`, import.meta.url), 'utf8')

/** The string literals matched by `pattern` (one capture) in `text` from `start` to the next `end`. */
function literals(text, start, end, pattern) {
  const from = text.indexOf(start)
  assert.ok(from >= 0, `${start} not found`)
  const to = text.indexOf(end, from + start.length)
  assert.ok(to >= 0, `${end} not found after ${start}`)
  const found = [...text.slice(from, to).matchAll(pattern)].map((m) => m[1])
  assert.ok(found.length > 0, `no literals after ${start}`)
  return found
}

/** Each union of js/index.d.ts, and the codes the Rust side emits for it. */
function emitted() {
  const security = read('crates/courier-proto/src/security.rs')
  const hook = read('crates/courier-engine/src/hook/mod.rs')
  const failReasons = literals(read('crates/courier-engine/src/io.rs'), 'impl FailReason', 'pub fn parse', /=> "([^"]+)"/g)
  return {
    SecurityWarningReasonCode: [
      ...literals(security, '//!', 'SECURITY_WARNING_CODES', /pub const [A-Z_]+: &str = "([A-Z_]+)"/g),
      ...literals(hook, 'const RETENTION_EXPIRED', ';', /"([A-Z_]+)"/g),
    ],
    DecryptionFailureCode: literals(read('crates/courier-crypto/src/sessions.rs'), 'pub mod code {', '}', /"([A-Z_]+)"/g),
    // A connection request's failure is its own event, `connection_request_undeliverable`
    // (crates/courier-client/src/event.rs); a file chunk's is its transfer's, `file_failed`
    // (crates/courier-engine/src/engine/media.rs).
    MessageFailedReason: failReasons.filter((r) => !['Connection request undeliverable', 'Media transfer aborted'].includes(r)),
    UndeliverableReasonCode: literals(read('crates/courier-proto/src/unreachable.rs'), 'pub fn as_str', '}\n    }', /=> "([a-z_]+)"/g),
  }
}

test('the reason-code unions of the typings are the codes the Rust crates emit', () => {
  const sets = emitted()
  const typings = fileURLToPath(new URL('../js/index.js', import.meta.url))
  const lines = [
    `import type { ${Object.keys(sets).join(', ')} } from ${JSON.stringify(typings)}`,
    '/** Fails to compile, naming what is left, unless `T` is `never`. */',
    'type Empty<T extends never> = T',
  ]
  for (const [union, codes] of Object.entries(sets)) {
    const rust = codes.map((c) => JSON.stringify(c)).join(' | ')
    lines.push(`export type ${union}NotEmitted = Empty<Exclude<${union}, ${rust}>>`)
    lines.push(`export type ${union}NotDeclared = Empty<Exclude<${rust}, ${union}>>`)
  }
  const source = `${lines.join('\n')}\n`
  const result = typeCheck(source)
  assert.equal(result.status, 0, `js/index.d.ts and the Rust crates disagree:\n${result.stdout}${result.stderr}\n${source}`)
})
