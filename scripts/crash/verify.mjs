// The verdict of a crash run, read from what survived the kills: each engine's storage (the
// outbox, the settled outcomes, the inbound buffer), each app's own inbox database and each
// app's append-only log.
import { existsSync, readFileSync } from 'node:fs'

import Database from 'better-sqlite3'

export const DOCUMENTED_FAILURE_REASONS = new Set([
  'Max retries exceeded',
  'Outbox lifetime exceeded',
  'Outbox capacity exceeded',
  'Pending session lifetime exceeded',
  'Pending session queue capacity exceeded',
])

/** The records of an app log; a line torn by a kill (none expected: one write per line) is counted. */
export function readLog(path) {
  const records = []
  let torn = 0
  if (!existsSync(path)) return { records, torn }
  for (const line of readFileSync(path, 'utf8').split('\n')) {
    if (line === '') continue
    try {
      records.push(JSON.parse(line))
    } catch {
      torn++
    }
  }
  return { records, torn }
}

function readOnly(path, read) {
  const db = new Database(path, { readonly: true, fileMustExist: true })
  try {
    return read(db)
  } finally {
    db.close()
  }
}

/** What a peer's files say. */
function loadPeer(peer) {
  const { records, torn } = readLog(peer.log)
  const engine = readOnly(peer.storage, (db) => ({
    settled: new Map(db.prepare('SELECT id, recipient, outcome, reason, at FROM settled').all().map((r) => [r.id, r])),
    outbox: new Map(db.prepare('SELECT id, recipient, state FROM outbox').all().map((r) => [r.id, r])),
    pendingInbound: db.prepare('SELECT COUNT(*) AS n FROM pending_inbound').get().n,
  }))
  const app = readOnly(peer.inbox, (db) => ({
    inbox: db.prepare('SELECT chat, sender, message_id AS id, content FROM inbox').all(),
    offers: db.prepare('SELECT message_id AS id, n FROM offers').all(),
  }))
  const addresses = new Set(records.filter((r) => r.t === 'identity').map((r) => r.address))
  return { ...peer, records, torn, engine, app, addresses }
}

/**
 * The terminal events the sender's app saw for one settled message. A settlement's event is
 * held in storage until its dispatch is recorded and emitted again (`replayed: true`) by the
 * next start if a kill came first: so at least one event, each matching the stored outcome, at
 * most one of them not a replay, and a replay only after a kill of the sender.
 */
function checkTerminalEvents(sender, id, outcome, events, totals, violations) {
  const where = `${sender.name}: ${id} (settled ${outcome.outcome} at ${outcome.at})`
  if (events.length === 0) {
    totals.terminalLost++
    const kill = sender.kills.find((k) => k >= outcome.at)
    const after = kill === undefined ? 'no kill after the commit' : `killed ${kill - outcome.at} ms after the commit`
    violations.push(`${where}: no terminal event ever reached the app (${after})`)
    return
  }
  for (const e of events) {
    if (e.t !== outcome.outcome || (e.t === 'failed' && e.reason !== outcome.reason)) {
      violations.push(`${where}: the app saw ${e.t} ${e.reason ?? ''}`)
    }
  }
  const fresh = events.filter((e) => !e.replayed)
  if (fresh.length > 1) violations.push(`${where}: ${fresh.length} terminal events not marked replayed`)
  let previous = outcome.at
  for (const e of events) {
    if (e.replayed && !sender.kills.some((k) => k >= previous && k <= e.at)) {
      violations.push(`${where}: a replayed terminal event at ${e.at} with no kill of the sender before it`)
    }
    previous = e.at
  }
  if (events.length === 1 && fresh.length === 1) totals.terminalOnce++
  else if (fresh.length === 1) totals.terminalReplayedAfterKill++
  else totals.terminalFirstSeenReplayed++
}

/**
 * Checks every guarantee the run is about and counts what happened.
 * @param {{ peers: Array<{ name, storage, inbox, log, kills: number[] }> }} run
 */
export function verify({ peers }) {
  const violations = []
  const loaded = peers.map(loadPeer)
  const byAddress = new Map()
  for (const p of loaded) {
    if (p.addresses.size !== 1) violations.push(`${p.name}: ${p.addresses.size} identities across restarts (expected one)`)
    if (p.torn > 0) violations.push(`${p.name}: ${p.torn} torn log lines`)
    for (const address of p.addresses) byAddress.set(address, p)
  }

  const totals = {
    accepted: 0,
    acceptedUnlogged: 0,
    sendsCut: 0,
    delivered: 0,
    failed: {},
    failedToPeer: 0,
    failedButReceived: 0,
    lost: 0,
    duplicates: 0,
    stuck: 0,
    terminalOnce: 0,
    terminalReplayedAfterKill: 0,
    terminalFirstSeenReplayed: 0,
    terminalLost: 0,
    redeliveriesAbsorbed: 0,
    receivedEvents: 0,
    receivedEventsCut: 0,
  }
  const perPeer = {}

  for (const sender of loaded) {
    const recipient = loaded.find((p) => p !== sender)
    const address = [...sender.addresses][0]
    const logged = new Map()
    const intents = new Set()
    const terminal = new Map()
    for (const r of sender.records) {
      if (r.t === 'sent') logged.set(r.id, r)
      else if (r.t === 'intent') intents.add(r.seq)
      else if (r.t === 'send_error') violations.push(`${sender.name}: sendMessage #${r.seq} rejected: ${r.code} ${r.message}`)
      else if (r.t === 'delivered' || r.t === 'failed') {
        if (!terminal.has(r.id)) terminal.set(r.id, [])
        terminal.get(r.id).push(r)
      } else if (r.t === 'superseded') violations.push(`${sender.name}: session superseded (${r.reason})`)
      else if (r.t === 'error') violations.push(`${sender.name}: error diagnostic: ${r.message}`)
    }
    const { settled, outbox } = sender.engine
    const accepted = new Set([...logged.keys(), ...settled.keys(), ...outbox.keys()])
    const loggedSeqs = new Set([...logged.values()].map((r) => r.seq))
    const cutSends = [...intents].filter((s) => !loggedSeqs.has(s)).length
    totals.sendsCut += cutSends
    totals.acceptedUnlogged += accepted.size - logged.size
    totals.accepted += accepted.size
    perPeer[sender.name] = { accepted: accepted.size, sendsCut: cutSends }
    if (sender.engine.pendingInbound > 0) violations.push(`${sender.name}: ${sender.engine.pendingInbound} inbound messages still buffered`)

    const theirs = new Map(recipient.app.inbox.filter((r) => r.sender === address).map((r) => [r.id, r]))
    for (const id of accepted) {
      const outcome = settled.get(id)
      const received = theirs.has(id)
      const to = logged.get(id)?.to ?? outcome?.recipient ?? outbox.get(id)?.recipient
      if (!outcome) {
        if (outbox.has(id)) {
          totals.stuck++
          violations.push(`${sender.name}: ${id} to ${to} still ${outbox.get(id).state} after quiescence`)
        } else {
          totals.lost++
          violations.push(`${sender.name}: ${id} to ${to} was accepted and is neither pending nor settled`)
        }
        continue
      }
      if (outbox.has(id)) violations.push(`${sender.name}: ${id} is both settled and in the outbox`)
      if (outcome.outcome === 'delivered') {
        totals.delivered++
        if (!received) {
          totals.lost++
          violations.push(`${sender.name}: ${id} settled delivered but is not in ${recipient.name}'s inbox`)
        }
      } else {
        totals.failed[outcome.reason] = (totals.failed[outcome.reason] ?? 0) + 1
        if (!DOCUMENTED_FAILURE_REASONS.has(outcome.reason)) violations.push(`${sender.name}: ${id} failed with an undocumented reason ${outcome.reason}`)
        if (outcome.recipient === recipient.name) totals.failedToPeer++
        if (received) totals.failedButReceived++
      }
      checkTerminalEvents(sender, id, outcome, terminal.get(id) ?? [], totals, violations)
    }
    for (const id of terminal.keys()) {
      if (!accepted.has(id)) violations.push(`${sender.name}: terminal event for ${id}, which it never accepted`)
    }
  }

  for (const receiver of loaded) {
    const seen = new Map()
    for (const row of receiver.app.inbox) {
      const from = byAddress.get(row.sender)
      if (!from) {
        violations.push(`${receiver.name}: inbox row ${row.id} from an unknown sender ${row.sender}`)
        continue
      }
      if (!from.engine.settled.has(row.id) && !from.engine.outbox.has(row.id)) {
        violations.push(`${receiver.name}: inbox row ${row.id} that ${from.name} never accepted`)
      }
      // One content per send: the same content under two ids is a message delivered twice.
      if (seen.has(row.content)) {
        totals.duplicates++
        violations.push(`${receiver.name}: "${row.content}" delivered twice (${seen.get(row.content)}, ${row.id})`)
      }
      seen.set(row.content, row.id)
    }
    totals.redeliveriesAbsorbed += receiver.app.offers.reduce((sum, o) => sum + o.n - 1, 0)
    const inboxIds = new Set(receiver.app.inbox.map((r) => r.id))
    const receivedEvents = new Map()
    for (const r of receiver.records) {
      if (r.t === 'received') receivedEvents.set(r.id, (receivedEvents.get(r.id) ?? 0) + 1)
    }
    for (const [id, n] of receivedEvents) {
      totals.receivedEvents++
      // Inbound dedup (docs/delivery.md#inbound-dedup): a redelivery after a restart is recognised
      // and not dispatched again.
      if (n > 1) violations.push(`${receiver.name}: message_received ${n} times for ${id}`)
      if (!inboxIds.has(id)) violations.push(`${receiver.name}: message_received for ${id}, which the hook never committed`)
    }
    totals.receivedEventsCut += [...inboxIds].filter((id) => !receivedEvents.has(id)).length
  }
  return { totals, perPeer, violations }
}
