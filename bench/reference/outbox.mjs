// The reference client of `bench/compare.mjs`: what a Node developer writes by hand instead of
// this package — a durable outbox and inbox on better-sqlite3 and a `ws` connection to a relay
// speaking the frames of docs/protocol.md.
//
// - `send()` resolves once the message is committed to the outbox. Every write queued in one
//   event-loop tick shares one transaction (WAL, synchronous=FULL): one fsync per tick, not per
//   message. The frame goes out once committed.
// - The recipient stores each message (tick-batched the same way) before it sends the end-to-end
//   ACK back as a `SendMessage`, and releases the relay frame when the relay numbered it.
// - The sender deletes the outbox row when the ACK arrives from the message's recipient; rows
//   not ACKed are sent again on every new connection and after `ackTimeoutMs`. A lost connection
//   is dialled again after a second.
//
// With `store: null` the same client keeps everything in memory: the "plain" client of the
// non-durable comparison.
import { randomUUID } from 'node:crypto'

import Database from 'better-sqlite3'
import WebSocket from 'ws'

const RECONNECT_MS = 1000

/** One SQLite database whose writes are committed in one transaction per event-loop tick. */
export class TickStore {
  constructor(path) {
    this.db = new Database(path)
    this.db.pragma('journal_mode = WAL')
    this.db.pragma('synchronous = FULL')
    this.db.exec(`
      CREATE TABLE IF NOT EXISTS outbox (seq INTEGER PRIMARY KEY, id TEXT NOT NULL, recipient TEXT NOT NULL, content TEXT NOT NULL, queued_at INTEGER NOT NULL);
      CREATE TABLE IF NOT EXISTS inbox (sender TEXT NOT NULL, id TEXT NOT NULL, content TEXT NOT NULL, received_at INTEGER NOT NULL, PRIMARY KEY (sender, id));
    `)
    this.insertOutbox = this.db.prepare('INSERT INTO outbox (id, recipient, content, queued_at) VALUES (?, ?, ?, ?)')
    this.deleteOutbox = this.db.prepare('DELETE FROM outbox WHERE seq = ?')
    this.selectOutbox = this.db.prepare('SELECT seq, id, recipient, content, queued_at AS queuedAt FROM outbox ORDER BY seq')
    this.insertInbox = this.db.prepare('INSERT OR IGNORE INTO inbox (sender, id, content, received_at) VALUES (?, ?, ?, ?)')
    this.queue = []
    this.commit = this.db.transaction((writes) => writes.map((w) => w.write()))
  }

  /**
   * Runs `write` in this tick's transaction; resolves with what it returned once that
   * transaction is committed.
   */
  write(write) {
    return new Promise((resolve, reject) => {
      if (this.queue.length === 0) setImmediate(() => this.flush())
      this.queue.push({ write, resolve, reject })
    })
  }

  flush() {
    const writes = this.queue
    this.queue = []
    let results
    try {
      results = this.commit(writes)
    } catch (e) {
      for (const w of writes) w.reject(e)
      return
    }
    for (let i = 0; i < writes.length; i++) writes[i].resolve(results[i])
  }

  close() {
    this.db.close()
  }
}

/** Keeps the outbox in memory: the non-durable client. */
class MemoryOutbox {
  rows = new Map()
  add(row) {
    this.rows.set(row.id, row)
    return Promise.resolve()
  }
  remove(id) {
    this.rows.delete(id)
    return Promise.resolve()
  }
  all() {
    return [...this.rows.values()]
  }
}

/**
 * The outbox in a `TickStore`, with an in-memory index of what awaits its ACK. Rows are keyed by
 * an integer (appended in order) rather than by the random message id, which would scatter every
 * tick's inserts across an index.
 */
class DurableOutbox {
  rows = new Map()
  constructor(store) {
    this.store = store
    for (const row of store.selectOutbox.all()) this.rows.set(row.id, row)
  }
  add(row) {
    this.rows.set(row.id, row)
    return this.store.write(() => {
      row.seq = this.store.insertOutbox.run(row.id, row.recipient, row.content, row.queuedAt).lastInsertRowid
    })
  }
  remove(id) {
    const { seq } = this.rows.get(id)
    this.rows.delete(id)
    return this.store.write(() => this.store.deleteOutbox.run(seq))
  }
  all() {
    return [...this.rows.values()]
  }
}

export class Client {
  /**
   * @param {object} o
   * @param {string} o.account  the token's account: the sender of this client's messages
   * @param {TickStore|null} o.store  null keeps everything in memory
   * @param {string} [o.url]  the relay; without it the client only queues
   * @param {string} [o.token]
   * @param {(id: string) => void} [o.onDelivered]  a message's ACK arrived and its row is deleted
   * @param {(message: object) => void} [o.onMessage]  a message was stored and ACKed
   */
  constructor({ account, store, url, token, onDelivered = () => {}, onMessage = () => {}, ackTimeoutMs = 15_000 }) {
    this.account = account
    this.store = store
    this.outbox = store ? new DurableOutbox(store) : new MemoryOutbox()
    this.url = url
    this.token = token
    this.onDelivered = onDelivered
    this.onMessage = onMessage
    this.ackTimeoutMs = ackTimeoutMs
    this.ws = null
    this.live = false
    this.closed = false
    this.retry = setInterval(() => this.resendOverdue(), ackTimeoutMs)
    this.retry.unref()
  }

  /** Connects and authenticates; resolves once the relay answered `Authenticated`. */
  connect() {
    return new Promise((resolve, reject) => {
      const ws = new WebSocket(this.url, { perMessageDeflate: false })
      this.ws = ws
      ws.on('open', () => ws.send(JSON.stringify({ type: 'Authenticate', token: this.token })))
      ws.on('message', (data) => {
        const frame = JSON.parse(data)
        if (frame.type === 'Authenticated') {
          this.live = true
          for (const row of this.outbox.all()) this.write(row)
          resolve()
        } else if (frame.type === 'AuthError') {
          reject(new Error(`authentication refused: ${frame.reason}`))
        } else {
          this.receive(frame)
        }
      })
      ws.on('close', () => {
        this.live = false
        if (!this.closed) setTimeout(() => this.connect().catch(() => {}), RECONNECT_MS).unref()
      })
      ws.on('error', reject)
    })
  }

  /** Queues a message durably; resolves with its id once committed. */
  async send(recipient, text) {
    const id = randomUUID()
    const content = JSON.stringify({ id, sender: this.account, recipient, app_id: 'bench', timestamp: Date.now(), content_type: 'text', content: text, requires_ack: true })
    const row = { id, recipient, content, queuedAt: Date.now() }
    await this.outbox.add(row)
    if (this.live) this.write(row)
    return id
  }

  write(row) {
    row.sentAt = Date.now()
    this.ws.send(JSON.stringify({ type: 'SendMessage', recipient: row.recipient, content: row.content, message_id: row.id }))
  }

  resendOverdue() {
    if (!this.live) return
    const overdue = Date.now() - this.ackTimeoutMs
    for (const row of this.outbox.all()) if (row.sentAt !== undefined && row.sentAt < overdue) this.write(row)
  }

  receive(frame) {
    if (frame.type !== 'MessageReceived') return
    const message = JSON.parse(frame.content)
    const ackFor = message.metadata?.ack_for
    if (ackFor !== undefined) {
      // Only the message's recipient settles it (docs/protocol.md, Delivery ACK).
      const row = this.outbox.rows.get(ackFor)
      if (row !== undefined && row.recipient === frame.sender) {
        this.outbox.remove(ackFor).then(() => this.onDelivered(ackFor), crash)
      }
      this.release(frame)
      return
    }
    const stored = this.store
      ? this.store.write(() => this.store.insertInbox.run(frame.sender, message.id, frame.content, Date.now()))
      : Promise.resolve({ changes: 1 })
    stored.then(({ changes }) => {
      // A duplicate is ACKed again (the first ACK may have been lost) but reaches the app once.
      const ack = { id: `${message.id}.ack`, sender: this.account, recipient: frame.sender, app_id: message.app_id, timestamp: Date.now(), content_type: 'text', content: '', requires_ack: false, metadata: { ack_for: message.id } }
      this.ws.send(JSON.stringify({ type: 'SendMessage', recipient: frame.sender, content: JSON.stringify(ack), message_id: ack.id }))
      this.release(frame)
      if (changes > 0) this.onMessage(message)
    }, crash)
  }

  release(frame) {
    if (frame.seq !== undefined) this.ws.send(JSON.stringify({ type: 'Ack', seq: frame.seq }))
  }

  close() {
    this.closed = true
    clearInterval(this.retry)
    this.ws?.close()
  }
}

function crash(e) {
  process.nextTick(() => {
    throw e
  })
}
