// `Symbol.asyncDispose` on `Protocol` and on the relay and gateway handles: `await using` stops
// them at the end of the scope, as TypeScript compiles it for this Node.
import assert from 'node:assert/strict'
import { writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { test } from 'node:test'
import { pathToFileURL } from 'node:url'

import ts from 'typescript'

import { Gateway, Protocol, ProtocolError, Relay } from '../js/index.js'
import { PLAINTEXT, SECRET, tempDir, token } from './helpers.mjs'

const asyncDispose = Symbol.asyncDispose ?? Symbol.for('nodejs.asyncDispose')

const stopped = (e) => {
  assert.ok(e instanceof ProtocolError, `expected ProtocolError, got ${e}`)
  assert.equal(e.code, 'ERR_NOT_STARTED')
  return true
}

/** A module compiled from TypeScript whose scope holds a relay, a gateway and a device with `await using`. */
async function compiledScope(dir) {
  const source = `
    export async function scope(make: any, inside: (handles: any) => void): Promise<void> {
      await using relay = await make.relay()
      await using gateway = await make.gateway()
      await using protocol = make.protocol(relay.url)
      await protocol.start()
      inside({ relay, gateway, protocol })
    }
  `
  const { outputText } = ts.transpileModule(source, { compilerOptions: { target: ts.ScriptTarget.ES2022, module: ts.ModuleKind.ES2022 } })
  const file = join(dir, 'scope.mjs')
  writeFileSync(file, outputText)
  return (await import(pathToFileURL(file).href)).scope
}

test('await using stops the protocol, the gateway and the relay at the end of the scope', async (t) => {
  const dir = tempDir(t)
  const scope = await compiledScope(dir)
  let handles
  await scope(
    {
      relay: () => Relay.start({ storage: { memory: true }, jwtSecret: SECRET }),
      gateway: () => Gateway.start(),
      protocol: (url) =>
        new Protocol({ appId: 'test', storage: { path: join(dir, 'p.db') }, encryption: PLAINTEXT, transports: { internet: { url, authToken: token('alice') } } }),
    },
    (inside) => {
      handles = inside
      assert.equal(inside.relay.stats().connections >= 0, true)
      assert.equal(inside.gateway.boundAddresses(), 0)
      assert.match(inside.protocol.localAddress(), /^off1/)
    },
  )
  const { relay, gateway, protocol } = handles
  assert.throws(() => relay.stats(), stopped)
  assert.throws(() => gateway.boundAddresses(), stopped)
  await assert.rejects(protocol.sendMessage('bob', 'after the scope'), stopped)

  // Disposing again, as a second `await using` of the same object would, does nothing.
  await relay[asyncDispose]()
  await gateway[asyncDispose]()
  await protocol[asyncDispose]()
  // The storage lock was released: the same file opens again.
  const again = new Protocol({ appId: 'test', storage: { path: join(dir, 'p.db') }, encryption: PLAINTEXT })
  await again.start()
  await again[asyncDispose]()
})
