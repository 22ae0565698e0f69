'use strict'
// `sendMessage` calls cross to the native side in bursts: the calls of one turn of the event loop
// go as one array, in call order, and come back as one array of ids and errors. A burst of
// thousands of sends then costs a few crossings instead of one each.

const { toProtocolError } = require('./error.js')

// Bounds one crossing's array: a larger burst goes as several, still in order.
const MAX_BURST = 1024

class Sends {
  #sendMessages
  #inputs = []
  #waiters = []
  #scheduled = false

  /** `sendMessages(inputs)` returns a Promise of one id or Error per input. */
  constructor(sendMessages) {
    this.#sendMessages = sendMessages
  }

  /** Queues one send; resolves with its message id once it is durably in the outbox. */
  push(input) {
    return new Promise((resolve, reject) => {
      this.#inputs.push(input)
      this.#waiters.push({ resolve, reject })
      if (this.#inputs.length >= MAX_BURST) this.flush()
      else if (!this.#scheduled) {
        this.#scheduled = true
        queueMicrotask(() => this.flush())
      }
    })
  }

  /** Hands the queued sends over now: any other call to the native side comes after them. */
  flush() {
    this.#scheduled = false
    if (this.#inputs.length === 0) return
    const inputs = this.#inputs
    const waiters = this.#waiters
    this.#inputs = []
    this.#waiters = []
    const refuseAll = (e) => {
      const error = toProtocolError(e)
      for (const waiter of waiters) waiter.reject(error)
    }
    let answered
    try {
      answered = this.#sendMessages(inputs)
    } catch (e) {
      refuseAll(e)
      return
    }
    answered.then((outcomes) => {
      outcomes.forEach((outcome, i) => {
        if (outcome instanceof Error) waiters[i].reject(toProtocolError(outcome))
        else waiters[i].resolve(outcome)
      })
    }, refuseAll)
  }
}

module.exports = { Sends }
