// A relay cluster from the package (docs/cluster.md): `npm run cluster` starts three NATS servers
// and relay nodes over them (`courier-relay --cluster`), `Relay.start({ cluster })` adds a node
// in-process, and clients listing the nodes deliver through whichever node each is on.
import assert from 'node:assert/strict'
import { spawn } from 'node:child_process'
import { readFileSync } from 'node:fs'
import { once } from 'node:events'
import { createInterface } from 'node:readline'
import { test } from 'node:test'
import { fileURLToPath } from 'node:url'

import { Relay, issueToken } from '../js/index.js'
import { PLAINTEXT, started, tempDir, waitFor } from './helpers.mjs'

const CLUSTER = fileURLToPath(new URL('../scripts/cluster.mjs', import.meta.url))
const DEADLINE_MS = 90_000

/** Runs `npm run cluster`'s script with `args` until its `ready` line; stopped after the test. */
async function startCluster(t, args) {
  const child = spawn(process.execPath, [CLUSTER, ...args], { stdio: ['ignore', 'pipe', 'ignore'] })
  const exited = once(child, 'exit')
  t.after(async () => {
    if (child.exitCode === null && child.signalCode === null) {
      child.kill('SIGKILL')
      await exited
    }
  })
  const lines = createInterface({ input: child.stdout })
  const ready = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('the cluster was not ready in time')), DEADLINE_MS)
    lines.on('line', (line) => {
      if (line.startsWith('ready ')) {
        clearTimeout(timer)
        resolve(JSON.parse(line.slice('ready '.length)))
      }
    })
    child.once('exit', (code) => reject(new Error(`the cluster script exited (${code})`)))
  })
  return { child, exited, ready }
}

test('npm run cluster serves relay nodes over NATS, a node started in-process joins them, and clients on different nodes deliver', { timeout: 4 * DEADLINE_MS }, async (t) => {
  const dir = tempDir(t)
  const { child, exited, ready } = await startCluster(t, ['--nodes', '2'])
  assert.equal(ready.relays.length, 2)
  assert.equal(ready.nats.length, 3)
  const secret = readFileSync(ready.secretFile, 'utf8')

  const third = await Relay.start({ listen: '127.0.0.1:0', cluster: { servers: ready.nats }, jwtSecret: secret })
  t.after(() => third.stop())
  const config = (name, url) => ({
    appId: 'test',
    storage: { path: `${dir}/${name}.db` },
    transports: { internet: { url, authToken: issueToken(secret, name) } },
    encryption: PLAINTEXT,
  })
  const alice = await started(t, config('alice', ready.relays[0]))
  const bob = await started(t, config('bob', third.url))

  const id = await alice.protocol.sendMessage('bob', 'across nodes')
  const received = await waitFor(bob.recorder, (e) => e.type === 'message_received' && e.messageId === id, { timeoutMs: DEADLINE_MS, what: 'bob receives' })
  assert.equal(received.content, 'across nodes')
  await waitFor(alice.recorder, (e) => e.type === 'message_delivered' && e.messageId === id, { timeoutMs: DEADLINE_MS, what: 'alice hears it delivered' })

  await assert.rejects(
    Relay.start({ listen: '127.0.0.1:0', cluster: { servers: ready.nats }, storage: { memory: true }, jwtSecret: secret }),
    /cluster or storage, not both/,
  )
  child.kill('SIGTERM')
  const [code] = await exited
  assert.equal(code, 0, 'the script stops its servers and nodes and exits cleanly')
})
