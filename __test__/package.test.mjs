// The package layout: the entry point is the facade in `js/`, and the loader napi-rs generates
// is `native.js` (a root `index.js` would look like the entry point to a newcomer).
import assert from 'node:assert/strict'
import { existsSync, readFileSync } from 'node:fs'
import { test } from 'node:test'
import { fileURLToPath } from 'node:url'

const root = fileURLToPath(new URL('../', import.meta.url))
const pkg = JSON.parse(readFileSync(`${root}package.json`, 'utf8'))

test('the entry points are the facade and every published file exists', () => {
  assert.equal(pkg.main, 'js/index.js')
  assert.equal(pkg.types, 'js/index.d.ts')
  assert.deepEqual(pkg.files, ['native.js', 'native.d.ts', 'js/'])
  for (const file of pkg.files) assert.ok(existsSync(`${root}${file}`), `${file} is listed in files but missing`)
  for (const generated of ['index.js', 'index.d.ts']) {
    assert.ok(!existsSync(`${root}${generated}`), `a root ${generated} is back: the loader is native.js`)
  }
  assert.match(readFileSync(`${root}scripts/build-native.mjs`, 'utf8'), /'--js', 'native\.js', '--dts', 'native\.d\.ts'/)
  // The facade loads the addon through `js/binding.js`, which wraps napi-rs's loader.
  assert.match(readFileSync(`${root}js/index.js`, 'utf8'), /require\('\.\/binding\.js'\)/)
  assert.match(readFileSync(`${root}js/binding.js`, 'utf8'), /require\('\.\.\/native\.js'\)/)
})

test('the README lists every error code the typings declare', () => {
  const typings = readFileSync(`${root}js/index.d.ts`, 'utf8')
  const union = /export type ProtocolErrorCode =([^]*?)\n\n/.exec(typings)[1]
  const codes = [...union.matchAll(/'(ERR_[A-Z_]+)'/g)].map((m) => m[1])
  assert.ok(codes.length >= 9, `read ${codes.length} codes from ProtocolErrorCode`)
  const readme = readFileSync(`${root}README.md`, 'utf8')
  for (const code of codes) assert.ok(readme.includes(`\`${code}\``), `README does not list ${code}`)
})
