// Transfers that outlive their processes (`docs/delivery.md#resuming-a-transfer`): a sender
// SIGKILLed at 40 % resumes from its manifest and sends no acknowledged chunk again; a receiver
// killed mid-assembly keeps what it wrote; a transfer from bytes asks for them again at start
// (`media_resend_required`) and, given them, sends only what the receiver lacks.
import assert from 'node:assert/strict'
import { createHash, randomBytes } from 'node:crypto'
import { readFileSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { test } from 'node:test'

import { PLAINTEXT, PeerProcess, peerConfig, startRelay, tempDir } from './helpers.mjs'

const MiB = 1024 * 1024
// About what one chunk frame costs the rate bucket: a token per started 4 KiB of its text
// (docs/protocol.md#rate-limiting), and a 256 KiB chunk travels as ~342 KiB of base64 in JSON.
// The limits below are counted in chunks.
const CHUNK_TOKENS = 90
const sha256 = (bytes) => createHash('sha256').update(bytes).digest('hex')

function config(name, dir, url) {
  const { encryption, ...base } = peerConfig(name, dir, url, { logLevel: 'debug' })
  assert.equal(encryption, PLAINTEXT)
  return { ...base, media: { directory: join(dir, `${name}-media`) } }
}

/** Starts a peer process; resolves once it is connected. */
async function peer(t, name, dir, url, env = {}) {
  const p = new PeerProcess(config(name, dir, url), env)
  t.after(() => p.kill())
  await p.request({ cmd: 'start' })
  await p.waitFor((e) => e.type === 'internet_status_changed' && e.connected, { what: `${name} connected` })
  return p
}

/** The chunk indexes of `fileId` a sender's debug lines say went out, and were acknowledged. */
function chunkLog(p, fileId) {
  const lines = p.recorder.events.filter((e) => e.type === 'diagnostic' && e.target === 'courier_client::media')
  const pick = (verb) =>
    lines
      .map((e) => e.message.match(new RegExp(`^file ${fileId} generation \\d+ chunk (\\d+) ${verb}$`)))
      .filter(Boolean)
      .map((m) => Number(m[1]))
  return { sent: pick('goes out'), acked: new Set(pick('acknowledged')) }
}

async function received(p, fileId, bytes) {
  const got = await p.waitFor((e) => e.type === 'file_received' && e.fileId === fileId, { timeoutMs: 120_000, what: 'the file at the receiver' })
  assert.equal(got.sha256, sha256(bytes))
  assert.deepEqual(readFileSync(got.path), bytes)
  return got
}

/**
 * A slow relay (the transfer takes seconds, so 40 % is well before the end), Bob on it, a file of
 * `size` random bytes, and Alice set to die at 40 % of what she sends.
 */
async function senderDiesAt40(t, size, name) {
  const dir = tempDir(t)
  const relay = await startRelay(t, { rateLimit: { burst: 40 * CHUNK_TOKENS, perSec: 20 * CHUNK_TOKENS } })
  const bob = await peer(t, 'bob', dir, relay.url)
  const bobAddress = await bob.request({ cmd: 'address' })
  const bytes = randomBytes(size)
  const path = join(dir, name)
  writeFileSync(path, bytes)
  const marker = join(dir, 'alice-died')
  const first = await peer(t, 'alice', dir, relay.url, { PEER_DIE_AT_PROGRESS: `outgoing:0.4:${marker}` })
  return { dir, relay, bob, bobAddress, bytes, path, first }
}

test('a sender killed at 40 % resumes after restart from the first unacknowledged chunk', async (t) => {
  const { dir, relay, bob, bobAddress, bytes, path, first } = await senderDiesAt40(t, 20 * MiB, 'video.mp4')
  const fileId = await first.request({ cmd: 'sendMedia', recipient: bobAddress, path, options: { fileId: 'video-1' } })
  const died = await first.exited
  assert.equal(died.signal, 'SIGKILL')
  const before = chunkLog(first, fileId)
  assert.ok(before.acked.size > 0 && before.acked.size < 80, `killed midway (${before.acked.size} of 80 acknowledged)`)

  const second = await peer(t, 'alice', dir, relay.url)
  await received(bob, fileId, bytes)
  await second.waitFor((e) => e.type === 'file_delivered' && e.fileId === fileId, { what: 'file_delivered after the restart' })
  const after = chunkLog(second, fileId)
  assert.ok(after.sent.length > 0, 'the restarted sender sent the rest')
  const resent = after.sent.filter((i) => before.acked.has(i))
  assert.deepEqual(resent, [], 'no acknowledged chunk went again')
  const firstUnacked = [...Array(80).keys()].find((i) => !before.acked.has(i))
  assert.ok(Math.min(...after.sent) >= firstUnacked, 'nothing before the first unacknowledged chunk went again')
  assert.ok(after.sent.length <= 80 - before.acked.size + 8, 'at most a window more than what was missing')
})

test('a receiver killed mid-assembly keeps what it wrote and completes the file', async (t) => {
  const dir = tempDir(t)
  const relay = await startRelay(t, { rateLimit: { burst: 40 * CHUNK_TOKENS, perSec: 20 * CHUNK_TOKENS } })
  const marker = join(dir, 'bob-died')
  const firstBob = await peer(t, 'bob', dir, relay.url, { PEER_DIE_AT_PROGRESS: `incoming:0.4:${marker}` })
  const bobAddress = await firstBob.request({ cmd: 'address' })
  const alice = await peer(t, 'alice', dir, relay.url)
  const bytes = randomBytes(20 * MiB)
  const path = join(dir, 'archive.tar')
  writeFileSync(path, bytes)

  const fileId = await alice.request({ cmd: 'sendMedia', recipient: bobAddress, path })
  assert.equal((await firstBob.exited).signal, 'SIGKILL')
  const held = firstBob.recorder.events.filter((e) => e.type === 'file_progress').at(-1)
  assert.ok(held.chunks > 0 && held.chunks < 80)

  const bob = await peer(t, 'bob', dir, relay.url)
  await received(bob, fileId, bytes)
  const resumed = bob.recorder.events.filter((e) => e.type === 'file_progress' && e.fileId === fileId)
  assert.ok(resumed[0].chunks >= held.chunks, 'the restarted receiver starts from what it held')
  await alice.waitFor((e) => e.type === 'file_delivered' && e.fileId === fileId)
  const { sent } = chunkLog(alice, fileId)
  assert.ok(sent.length <= 80 + 16, `the sender sent little more than the file (${sent.length} chunks)`)
})

test('a transfer from bytes asks for them at start and sends only what the receiver lacks', async (t) => {
  const { dir, relay, bob, bobAddress, bytes, path: source, first } = await senderDiesAt40(t, 12 * MiB, 'bytes.bin')
  const fileId = await first.request({
    cmd: 'sendMedia', recipient: bobAddress, path: source, fromBytes: true, options: { fileId: 'voice-1', fileName: 'voice.ogg' },
  })
  assert.equal((await first.exited).signal, 'SIGKILL')
  const before = chunkLog(first, fileId)

  const second = await peer(t, 'alice', dir, relay.url)
  const ask = await second.waitFor((e) => e.type === 'media_resend_required', { what: 'media_resend_required' })
  assert.deepEqual(ask, { type: 'media_resend_required', fileId, recipient: bobAddress, fileName: 'voice.ogg', fileSize: bytes.length })
  assert.equal((await second.request({ cmd: 'stats' })).outboxMedia, 0, 'nothing goes without the bytes')

  assert.equal(await second.request({ cmd: 'sendMedia', recipient: bobAddress, path: source, fromBytes: true, options: { fileId } }), fileId)
  await received(bob, fileId, bytes)
  await second.waitFor((e) => e.type === 'file_delivered' && e.fileId === fileId)
  const after = chunkLog(second, fileId)
  assert.deepEqual(after.sent.filter((i) => before.acked.has(i)), [], 'what the receiver holds is not sent again')
})
