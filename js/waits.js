'use strict'
// One-shot waits on a Protocol's events: `once(type)` and `whenDelivered(id)`. A wait is held
// only until it settles (by its event, its `signal` or `stop()`), so nothing is left behind per
// type or per message id once it has.

const { ProtocolError, invalid } = require('./error.js')

/** The options of a wait: only `signal`. */
function signalOption(options) {
  if (options === null || typeof options !== 'object' || Array.isArray(options)) throw invalid('options must be an object')
  for (const key of Object.keys(options)) {
    if (key !== 'signal') throw invalid(`options.${key} is not a known option`)
  }
  const { signal } = options
  if (signal !== undefined && !(signal instanceof AbortSignal)) throw invalid('options.signal must be an AbortSignal')
  return signal
}

/** The message a terminal event settles, or `undefined` for any other event. */
function settledId(event) {
  switch (event.type) {
    case 'message_delivered':
    case 'message_failed':
      return event.messageId
    case 'connection_request_undeliverable':
      return event.requestId
    default:
      return undefined
  }
}

/**
 * `ERR_MESSAGE_FAILED` for message `id`, with its failure event as `event` and `cause`; without
 * one when the failure is known only from storage (it was dispatched before the wait began).
 */
function messageFailed(id, event) {
  if (event === undefined) {
    return new ProtocolError('ERR_MESSAGE_FAILED', `message ${id} had failed before whenDelivered() was called`)
  }
  const why = event.type === 'message_failed' ? event.reason : 'the relay cannot reach the peer now'
  const error = new ProtocolError('ERR_MESSAGE_FAILED', `message ${id} failed: ${why}`, { cause: event })
  error.event = event
  return error
}

/** One pending wait, in the set `holders` under `key` until it settles. */
class Wait {
  #resolve
  #reject
  #release
  #settled = false

  constructor(holders, key, signal) {
    this.promise = new Promise((resolve, reject) => {
      this.#resolve = resolve
      this.#reject = reject
    })
    const onAbort = () => this.reject(new ProtocolError('ERR_ABORTED', 'the wait was aborted', { cause: signal.reason }))
    let set = holders.get(key)
    if (set === undefined) holders.set(key, (set = new Set()))
    set.add(this)
    this.#release = () => {
      if (!set.delete(this)) return false
      if (set.size === 0) holders.delete(key)
      signal?.removeEventListener('abort', onAbort)
      return true
    }
    if (signal?.aborted) onAbort()
    else signal?.addEventListener('abort', onAbort, { once: true })
  }

  get pending() {
    return !this.#settled
  }

  resolve(value) {
    if (this.#release()) {
      this.#settled = true
      this.#resolve(value)
    }
  }

  reject(error) {
    if (this.#release()) {
      this.#settled = true
      this.#reject(error)
    }
  }
}

/** A wait for the terminal event of one message. */
class DeliveryWait extends Wait {
  #id

  constructor(holders, id, signal) {
    super(holders, id, signal)
    this.#id = id
  }

  settle(event) {
    if (event.type === 'message_delivered') this.resolve(event)
    else this.reject(messageFailed(this.#id, event))
  }

  /**
   * What `getMessageStatus` answered after the wait began. A terminal event dispatched before
   * the wait began shows there; one dispatched since settled the wait already.
   */
  fromStatus(status) {
    if (status === 'delivered') this.resolve(null)
    else if (status === 'failed') this.reject(messageFailed(this.#id, undefined))
    else if (status === 'unknown') {
      this.reject(invalid(`no message ${this.#id} in this storage (never sent from it, or settled long enough ago to be forgotten)`))
    }
  }
}

/** The waits of one Protocol. */
class Waits {
  /** Event type → waits for the next event of that type. */
  #byType = new Map()
  /** Message id → waits for that message's terminal event. */
  #byMessage = new Map()

  /** The next event of `type`. */
  next(type, signal) {
    return new Wait(this.#byType, type, signal).promise
  }

  /** A wait for message `id`'s terminal event, held from now on. */
  delivery(id, signal) {
    return new DeliveryWait(this.#byMessage, id, signal)
  }

  dispatch(event) {
    for (const wait of this.#byType.get(event.type) ?? []) wait.resolve(event)
    const id = settledId(event)
    if (id === undefined) return
    for (const wait of this.#byMessage.get(id) ?? []) wait.settle(event)
  }

  /** `stop()` ends every wait: a stopped protocol settles nothing until it starts again. */
  stopped() {
    for (const holders of [this.#byType, this.#byMessage]) {
      for (const set of [...holders.values()]) {
        for (const wait of set) wait.reject(new ProtocolError('ERR_NOT_STARTED', 'stop() was called while waiting'))
      }
    }
  }
}

module.exports = { Waits, signalOption }
