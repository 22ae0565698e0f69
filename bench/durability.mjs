// Inbound durability benchmark (`npm run bench:all`): 1 000 messages through an
// `inboundDurabilityHook` that commits each batch to SQLite (better-sqlite3, one transaction per
// batch), measured two ways in the same run:
//  - drain: the recipient was offline; the relay replays the backlog, batched (≤ 400 a batch);
//  - live: the recipient is online while the senders send; every message is a batch of one.
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'

import Database from 'better-sqlite3'

import { Protocol, Relay, issueToken } from '../js/index.js'

const SECRET = 'bench-secret-0123456789abcdef-0123'
const PER_SENDER = 500 // one outbox holds 500 messages
const dir = mkdtempSync(join(tmpdir(), 'offline-courier-durability-'))

function appStore(name) {
  const db = new Database(join(dir, `${name}-app.db`))
  db.pragma('journal_mode = WAL')
  db.exec('CREATE TABLE inbox (chat TEXT, sender TEXT, message_id TEXT, content TEXT, PRIMARY KEY (chat, sender, message_id))')
  const insert = db.prepare('INSERT OR IGNORE INTO inbox VALUES (?, ?, ?, ?)')
  const commit = db.transaction((batch) => {
    for (const m of batch) insert.run(m.chat, m.sender, m.messageId, String(m.content))
  })
  return { db, commit }
}

function peer(relay, name, extra = {}) {
  const protocol = new Protocol({
    appId: 'bench',
    storage: { path: join(dir, `${name}.db`) },
    transports: { internet: { url: relay.url, authToken: issueToken(SECRET, name) } },
    // The inbound durability path is measured alone, by account name.
    encryption: { enabled: false },
    ...extra,
  })
  const waitFor = (predicate) =>
    new Promise((resolve) => {
      const off = protocol.onEvent((e) => {
        if (predicate(e)) {
          off()
          resolve(e)
        }
      })
    })
  return { protocol, waitFor }
}

const connected = (e) => e.type === 'internet_status_changed' && e.connected

async function run(mode) {
  const relay = await Relay.start({ listen: '127.0.0.1:0', storage: { path: join(dir, `${mode}-relay.db`) }, jwtSecret: SECRET })
  const store = appStore(mode)
  let committed = 0
  let batches = 0
  let allCommitted
  const done = new Promise((resolve) => (allCommitted = resolve))
  const bobName = `${mode}-bob`
  const hook = async (batch) => {
    store.commit(batch)
    batches += 1
    committed += batch.length
    if (committed >= 2 * PER_SENDER) allCommitted()
  }
  // The relay learns bob's account first.
  const first = peer(relay, bobName)
  const firstUp = first.waitFor(connected)
  await first.protocol.start()
  await firstUp
  if (mode === 'drain') await first.protocol.stop()

  const senders = [peer(relay, `${mode}-alice`), peer(relay, `${mode}-carol`)]
  for (const s of senders) {
    const up = s.waitFor(connected)
    await s.protocol.start()
    await up
  }
  let bob
  if (mode === 'live') {
    await first.protocol.stop()
    bob = peer(relay, bobName, { inboundDurabilityHook: hook })
    const up = bob.waitFor(connected)
    await bob.protocol.start()
    await up
  }
  const started = process.hrtime.bigint()
  const sends = senders.flatMap((s) => Array.from({ length: PER_SENDER }, (_, i) => s.protocol.sendMessage(bobName, `message ${i}`)))
  await Promise.all(sends)
  if (mode === 'drain') {
    // Wait until the relay holds all of it, then time the replay alone.
    while (relay.stats().storedFrames < 2 * PER_SENDER) await new Promise((resolve) => setTimeout(resolve, 20))
    bob = peer(relay, bobName, { inboundDurabilityHook: hook })
  }
  const drainStarted = process.hrtime.bigint()
  if (mode === 'drain') await bob.protocol.start()
  await done
  const end = process.hrtime.bigint()
  const seconds = Number(end - (mode === 'drain' ? drainStarted : started)) / 1e9
  const rows = store.db.prepare('SELECT count(*) AS n FROM inbox').get().n
  await Promise.all([bob.protocol.stop(), ...senders.map((s) => s.protocol.stop())])
  await relay.stop()
  store.db.close()
  return { mode, seconds, perSecond: committed / seconds, batches, rows }
}

try {
  const drain = await run('drain')
  const live = await run('live')
  for (const r of [drain, live]) {
    console.log(`hook commits to SQLite, ${r.mode}: ${r.rows} messages in ${r.batches} batches, ${r.seconds.toFixed(2)} s = ${Math.round(r.perSecond)}/s`)
  }
  console.log(`drain batching vs batches of one: ${(drain.perSecond / live.perSecond).toFixed(1)}× the throughput`)
} finally {
  rmSync(dir, { recursive: true, force: true })
}
