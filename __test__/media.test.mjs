// File transfers from the public API (`docs/delivery.md#file-transfers`): `sendMedia` from a path
// or from bytes, sealed chunk by chunk through a real relay, `file_progress` on both sides,
// `file_received` with the file under its final name in `media.directory`, and the bounds —
// each a clear error or event that disturbs nothing else.
import assert from 'node:assert/strict'
import { createHash, randomBytes } from 'node:crypto'
import { existsSync, readFileSync, readdirSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { test } from 'node:test'

import { ProtocolError } from '../js/index.js'
import { PipeCarrier } from './pipe-carrier.mjs'
import { PLAINTEXT, ofType, peerConfig, startRelay, started, tempDir, waitFor } from './helpers.mjs'

/** A sealed device (the default) receiving into `<dir>/<name>-media`. */
export function mediaConfig(name, dir, url, media = {}) {
  const { encryption, ...config } = peerConfig(name, dir, url)
  assert.equal(encryption, PLAINTEXT)
  return { ...config, media: { directory: join(dir, `${name}-media`), ...media } }
}

const sha256 = (bytes) => createHash('sha256').update(bytes).digest('hex')

/** Progress of `fileId` one way never goes back, and ends at the whole file. */
export function assertMonotonic(recorder, fileId, direction, size) {
  const seen = ofType(recorder, 'file_progress').filter((e) => e.fileId === fileId && e.direction === direction)
  assert.ok(seen.length > 0, `${direction} progress of ${fileId}`)
  for (let i = 1; i < seen.length; i++) assert.ok(seen[i].bytes >= seen[i - 1].bytes, `${direction} progress went back`)
  assert.equal(seen.at(-1).bytes, size)
  assert.equal(seen.at(-1).totalBytes, size)
}

async function pair(t, media = {}) {
  const dir = tempDir(t)
  const relay = await startRelay(t)
  const alice = await started(t, mediaConfig('alice', dir, relay.url, media))
  const bob = await started(t, mediaConfig('bob', dir, relay.url, media))
  return { dir, relay, alice, bob, bobAddress: bob.protocol.localAddress() }
}

test('a file from a path and one from bytes arrive whole, checked, with their details', async (t) => {
  const { dir, alice, bob, bobAddress } = await pair(t)
  const onDisk = randomBytes(1_500_000)
  const path = join(dir, 'holiday.jpg')
  writeFileSync(path, onDisk)
  const inMemory = randomBytes(300_000)

  const photo = await alice.protocol.sendMedia(bobAddress, path, {
    contentType: 'image/jpeg', caption: 'the beach', metadata: { album: 'summer' },
  })
  const note = await alice.protocol.sendMedia(bobAddress, inMemory, { fileName: 'note.bin', fileId: 'note-1' })
  assert.equal(note, 'note-1')

  for (const [id, bytes, name] of [[photo, onDisk, 'holiday.jpg'], [note, inMemory, 'note.bin']]) {
    const got = await waitFor(bob.recorder, (e) => e.type === 'file_received' && e.fileId === id, { timeoutMs: 30_000, what: `${name} at bob` })
    assert.equal(got.sender, alice.protocol.localAddress())
    assert.equal(got.fileName, name)
    assert.equal(got.size, bytes.length)
    assert.equal(got.sha256, sha256(bytes))
    assert.equal(got.path, join(dir, 'bob-media', name))
    assert.deepEqual(readFileSync(got.path), bytes)
    await waitFor(alice.recorder, (e) => e.type === 'file_delivered' && e.fileId === id, { what: `${name} delivered` })
    assertMonotonic(alice.recorder, id, 'outgoing', bytes.length)
    assertMonotonic(bob.recorder, id, 'incoming', bytes.length)
  }
  const photoAtBob = ofType(bob.recorder, 'file_received').find((e) => e.fileId === photo)
  assert.equal(photoAtBob.contentType, 'image/jpeg')
  assert.equal(photoAtBob.caption, 'the beach')
  assert.deepEqual(photoAtBob.metadata, { album: 'summer' })
  assert.deepEqual(readdirSync(join(dir, 'bob-media', '.partial')), [], 'no partial file is left')
  assert.equal(ofType(bob.recorder, 'message_received').length, 0, 'chunks never show as messages')
  assert.equal(ofType(alice.recorder, 'message_delivered').length, 0, 'nor as deliveries')
  assert.equal(alice.protocol.stats().outboxMedia, 0)

  // A repeat of a delivered file id is a no-op.
  assert.equal(await alice.protocol.sendMedia(bobAddress, inMemory, { fileId: 'note-1' }), 'note-1')
})

test('bad input is refused with a clear error and nothing sent', async (t) => {
  const { dir, alice, bob, bobAddress } = await pair(t, { maxFileSize: 10_000, maxOutgoingTransfers: 1 })
  const refuse = async (promise, code) => {
    await assert.rejects(promise, (e) => e instanceof ProtocolError && e.code === code)
  }
  await refuse(alice.protocol.sendMedia(bobAddress, new Uint8Array(10_001)), 'ERR_FILE_TOO_LARGE')
  const big = join(dir, 'big.bin')
  writeFileSync(big, randomBytes(20_000))
  await refuse(alice.protocol.sendMedia(bobAddress, big), 'ERR_FILE_TOO_LARGE')
  await refuse(alice.protocol.sendMedia(bobAddress, join(dir, 'missing.bin')), 'ERR_FILE_UNREADABLE')
  await refuse(alice.protocol.sendMedia(bobAddress, dir), 'ERR_FILE_UNREADABLE')
  await refuse(alice.protocol.sendMedia(bobAddress, 42), 'ERR_INVALID_ARGUMENT')
  await refuse(alice.protocol.sendMedia(bobAddress, new Uint8Array(1), { colour: 'red' }), 'ERR_INVALID_ARGUMENT')
  await refuse(alice.protocol.sendMedia('not-an-address', new Uint8Array(1)), 'ERR_INVALID_ARGUMENT')
  await refuse(alice.protocol.sendMedia(bobAddress, new Uint8Array(1), { caption: 'x'.repeat(40_000) }), 'ERR_INVALID_ARGUMENT')
  assert.equal(alice.protocol.stats().outboxMedia, 0, 'nothing was queued')

  // The media outbox: one unfinished transfer at a time here. Bob is offline, so the first stays.
  await bob.protocol.stop()
  const first = await alice.protocol.sendMedia(bobAddress, new Uint8Array(5_000))
  assert.ok(first)
  await refuse(alice.protocol.sendMedia(bobAddress, new Uint8Array(5_000)), 'ERR_MEDIA_OUTBOX_FULL')
  // Messages are not disturbed by a full media outbox.
  const text = await alice.protocol.sendMessage(bobAddress, 'still here')
  assert.ok(text)
})

test('a file that changes midway arrives damaged, and the transfer starts over cleanly', async (t) => {
  const dir = tempDir(t)
  const relay = await startRelay(t)
  const alice = await started(t, { ...mediaConfig('alice', dir, relay.url), logLevel: 'debug' })
  const bob = await started(t, mediaConfig('bob', dir, relay.url))
  const bobAddress = bob.protocol.localAddress()
  // A session first, so that the whole window goes while Bob is away.
  const hello = await alice.protocol.sendMessage(bobAddress, 'a file follows')
  await waitFor(alice.recorder, (e) => e.type === 'message_delivered' && e.messageId === hello)
  // Sixteen chunks; the window of eight goes to the relay's mailbox while Bob is away.
  const original = randomBytes(4 * 1024 * 1024)
  const path = join(dir, 'draft.pdf')
  writeFileSync(path, original)
  bob.protocol.internetStatusChanged(false)
  await waitFor(bob.recorder, (e) => e.type === 'internet_status_changed' && !e.connected)
  const fileId = await alice.protocol.sendMedia(bobAddress, path)
  await waitFor(alice.recorder, (e) => e.type === 'diagnostic' && e.message === `file ${fileId} generation 0 chunk 7 goes out`)

  // The second half changes before it is read: what Bob assembles matches neither version.
  const edited = Buffer.concat([original.subarray(0, 2 * 1024 * 1024), randomBytes(2 * 1024 * 1024)])
  writeFileSync(path, edited)
  bob.protocol.internetStatusChanged(true)

  const got = await waitFor(bob.recorder, (e) => e.type === 'file_received' && e.fileId === fileId, { timeoutMs: 30_000, what: 'the file, sent again' })
  assert.equal(got.sha256, sha256(edited))
  assert.deepEqual(readFileSync(got.path), edited)
  await waitFor(alice.recorder, (e) => e.type === 'file_delivered' && e.fileId === fileId)
  assert.ok(alice.recorder.events.some((e) => e.type === 'diagnostic' && e.message.includes('generation 1')), 'it went as a second generation')
  assert.equal(ofType(alice.recorder, 'file_failed').length + ofType(bob.recorder, 'file_failed').length, 0)
  assert.equal(ofType(bob.recorder, 'file_received').length, 1)
})

test('a file over the receiver\'s bounds is refused there, and the sender hears it', async (t) => {
  const dir = tempDir(t)
  const relay = await startRelay(t)
  const alice = await started(t, mediaConfig('alice', dir, relay.url))
  const bob = await started(t, mediaConfig('bob', dir, relay.url, { maxIncomingBytes: 100_000, maxIncomingPerSender: 1 }))
  const bobAddress = bob.protocol.localAddress()
  const tooBig = await alice.protocol.sendMedia(bobAddress, new Uint8Array(200_000))
  // A sealed frame that does not open at bob is recovered by alice's re-sealed retry, one ACK
  // timeout (10 s) later: the wait allows for one.
  const refused = await waitFor(bob.recorder, (e) => e.type === 'file_failed' && e.fileId === tooBig, { timeoutMs: 30_000, what: "bob's refusal" })
  assert.equal(refused.direction, 'incoming')
  assert.match(refused.reason, /maxIncomingBytes/)
  const failed = await waitFor(alice.recorder, (e) => e.type === 'file_failed' && e.fileId === tooBig, { what: 'the refusal at the sender' })
  assert.match(failed.reason, /refused/)
  assert.equal(alice.protocol.stats().outboxMedia, 0, 'its chunks were withdrawn')
  // Nothing else is disturbed: a file within the bounds and a message still go.
  const fits = await alice.protocol.sendMedia(bobAddress, new Uint8Array(50_000))
  await waitFor(bob.recorder, (e) => e.type === 'file_received' && e.fileId === fits)
  const text = await alice.protocol.sendMessage(bobAddress, 'hello')
  await waitFor(alice.recorder, (e) => e.type === 'message_delivered' && e.messageId === text)
})

test('over an app carrier a file goes in the smaller chunks its frames allow', async (t) => {
  const dir = tempDir(t)
  const pipe = new PipeCarrier()
  const local = (name) => ({
    appId: 'test', storage: { path: join(dir, `${name}.db`) }, encryption: PLAINTEXT,
    media: { directory: join(dir, `${name}-media`), localChunkSize: 4096 },
  })
  const carol = await started(t, local('carol'), { connect: false })
  const dave = await started(t, local('dave'), { connect: false })
  pipe.attach('carol', carol.protocol)
  pipe.attach('dave', dave.protocol)
  pipe.link()
  const bytes = randomBytes(50_000)
  const fileId = await carol.protocol.sendMedia('dave', bytes, { fileName: 'map.png' })
  const got = await waitFor(dave.recorder, (e) => e.type === 'file_received' && e.fileId === fileId)
  assert.deepEqual(readFileSync(got.path), bytes)
  await waitFor(carol.recorder, (e) => e.type === 'file_delivered' && e.fileId === fileId)
  const chunks = pipe.delivered.map((f) => JSON.parse(f.frame)).filter((m) => m.content_type === 'file_chunk')
  const indexes = new Set(chunks.map((m) => m.media_metadata.index))
  assert.equal(indexes.size, Math.ceil(bytes.length / 4096), 'one chunk per 4 KiB')
  assert.ok(chunks.every((m) => Buffer.from(m.binary_content, 'base64').length <= 4096))
})

test('a received file is forwarded with where it came from', async (t) => {
  const { dir, relay, alice, bob, bobAddress } = await pair(t)
  const carol = await started(t, mediaConfig('carol', dir, relay.url))
  const carolAddress = carol.protocol.localAddress()
  const bytes = randomBytes(600_000)
  const fileId = await alice.protocol.sendMedia(bobAddress, bytes, { fileName: 'map.png', caption: 'the way', contentType: 'image/png' })
  await waitFor(bob.recorder, (e) => e.type === 'file_received' && e.fileId === fileId)

  const forwarded = await bob.protocol.forwardMessage(fileId, carolAddress)
  assert.notEqual(forwarded, fileId)
  const got = await waitFor(carol.recorder, (e) => e.type === 'file_received' && e.fileId === forwarded, { timeoutMs: 30_000 })
  assert.deepEqual(readFileSync(got.path), bytes)
  assert.equal(got.sender, bobAddress)
  assert.equal(got.fileName, 'map.png')
  assert.equal(got.caption, 'the way')
  assert.equal(got.contentType, 'image/png')
  assert.deepEqual(
    { messageId: got.forwardInfo.messageId, sender: got.forwardInfo.sender, forwardCount: got.forwardInfo.forwardCount },
    { messageId: fileId, sender: alice.protocol.localAddress(), forwardCount: 1 },
  )
  await waitFor(bob.recorder, (e) => e.type === 'file_delivered' && e.fileId === forwarded)

  // Forwarded again, it keeps its first origin and counts one more.
  const again = await carol.protocol.forwardMessage(forwarded, alice.protocol.localAddress())
  const back = await waitFor(alice.recorder, (e) => e.type === 'file_received' && e.fileId === again, { timeoutMs: 30_000 })
  assert.equal(back.forwardInfo.sender, alice.protocol.localAddress())
  assert.equal(back.forwardInfo.forwardCount, 2)
  await assert.rejects(bob.protocol.forwardMessage('never-received', carolAddress), (e) => e.code === 'ERR_MESSAGE_NOT_FOUND')
})
