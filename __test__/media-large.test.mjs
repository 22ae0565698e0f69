// A 50 MiB file from a path through a real relay to a recipient that is offline half the time
// (`docs/delivery.md#file-transfers`): it arrives once, its checksum matches, progress never goes
// back on either side, and neither process holds the file in memory.
import assert from 'node:assert/strict'
import { createHash, randomFillSync } from 'node:crypto'
import { closeSync, createReadStream, openSync, writeSync } from 'node:fs'
import { join } from 'node:path'
import { test } from 'node:test'

import { PLAINTEXT, PeerProcess, peerConfig, startRelay, tempDir } from './helpers.mjs'

const MiB = 1024 * 1024
const SIZE = 50 * MiB

function config(name, dir, url) {
  const { encryption, ...base } = peerConfig(name, dir, url)
  assert.equal(encryption, PLAINTEXT)
  return { ...base, media: { directory: join(dir, `${name}-media`) } }
}

/** Writes `size` random bytes to `path` a block at a time; resolves with their SHA-256. */
function writeRandomFile(path, size) {
  const hash = createHash('sha256')
  const fd = openSync(path, 'w')
  const block = Buffer.alloc(MiB)
  for (let done = 0; done < size; done += block.length) {
    randomFillSync(block)
    writeSync(fd, block)
    hash.update(block)
  }
  closeSync(fd)
  return hash.digest('hex')
}

async function fileSha256(path) {
  const hash = createHash('sha256')
  for await (const chunk of createReadStream(path)) hash.update(chunk)
  return hash.digest('hex')
}

function assertMonotonic(events, direction) {
  const seen = events.filter((e) => e.type === 'file_progress' && e.direction === direction)
  assert.ok(seen.length > 1, `${direction} progress was reported`)
  for (let i = 1; i < seen.length; i++) assert.ok(seen[i].bytes >= seen[i - 1].bytes, `${direction} progress went back`)
  assert.equal(seen.at(-1).bytes, SIZE)
}

test('50 MiB through the relay to a recipient offline half the time', async (t) => {
  const dir = tempDir(t)
  const relay = await startRelay(t)
  const start = async (name) => {
    const p = new PeerProcess(config(name, dir, relay.url))
    t.after(() => p.kill())
    await p.request({ cmd: 'start' })
    await p.waitFor((e) => e.type === 'internet_status_changed' && e.connected, { what: `${name} connected` })
    return p
  }
  const bob = await start('bob')
  const alice = await start('alice')
  const bobAddress = await bob.request({ cmd: 'address' })
  const path = join(dir, 'big.bin')
  const digest = writeRandomFile(path, SIZE)
  const baseline = { alice: await alice.request({ cmd: 'memory' }), bob: await bob.request({ cmd: 'memory' }) }
  const peak = { ...baseline }

  // Bob is offline when the transfer starts: the first chunks wait in the relay's mailbox.
  await bob.request({ cmd: 'online', online: false })
  await bob.waitFor((e) => e.type === 'internet_status_changed' && !e.connected, { what: 'bob offline' })
  const fileId = await alice.request({ cmd: 'sendMedia', recipient: bobAddress, path })
  const arrived = bob.waitFor((e) => e.type === 'file_received' && e.fileId === fileId, { timeoutMs: 240_000, what: 'the file at bob' })
  let done = false
  arrived.finally(() => { done = true }).catch(() => {})
  // Bob drops off and comes back every half second or so until the file is in: offline half
  // the time, whatever the transfer's pace.
  let online = false
  while (!done) {
    await new Promise((resolve) => setTimeout(resolve, 500))
    if (done) break
    online = !online
    await bob.request({ cmd: 'online', online })
    for (const name of ['alice', 'bob']) {
      const rss = await (name === 'alice' ? alice : bob).request({ cmd: 'memory' })
      peak[name] = Math.max(peak[name], rss)
    }
  }
  if (!online) await bob.request({ cmd: 'online', online: true })
  const got = await arrived
  for (const name of ['alice', 'bob']) {
    const rss = await (name === 'alice' ? alice : bob).request({ cmd: 'memory' })
    peak[name] = Math.max(peak[name], rss)
  }

  assert.equal(got.size, SIZE)
  assert.equal(got.sha256, digest)
  assert.equal(await fileSha256(got.path), digest)
  await alice.waitFor((e) => e.type === 'file_delivered' && e.fileId === fileId, { timeoutMs: 60_000 })
  assert.equal(bob.recorder.events.filter((e) => e.type === 'file_received').length, 1, 'it arrived once')
  assertMonotonic(alice.recorder.events, 'outgoing')
  assertMonotonic(bob.recorder.events, 'incoming')
  // Neither side held the file: each grew by well under its size.
  for (const name of ['alice', 'bob']) {
    const growth = peak[name] - baseline[name]
    t.diagnostic(`${name}: ${(baseline[name] / MiB).toFixed(1)} MiB resident before, peak ${(peak[name] / MiB).toFixed(1)} MiB`)
    assert.ok(growth < SIZE / 2, `${name} grew by ${(growth / MiB).toFixed(1)} MiB`)
  }
})
