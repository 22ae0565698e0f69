// A test carrier: an in-memory pipe that links Protocols in one process through
// `registerTransport`, like a BLE or Wi-Fi Direct link would. It can be cut and restored.
export class PipeCarrier {
  constructor(name = 'pipe') {
    this.name = name
    this.ends = new Map()
    this.cut = false
    this.delivered = []
  }

  /** Registers the carrier on `protocol`, which is `peerId` on this pipe. */
  attach(peerId, protocol) {
    this.ends.set(peerId, protocol)
    protocol.registerTransport(this.name, { send: (to, frame) => this.#send(peerId, to, frame) })
  }

  async #send(from, to, frame) {
    if (this.cut) throw new Error('the pipe is cut')
    const target = this.ends.get(to)
    if (!target) throw new Error(`nobody called ${to} on the pipe`)
    if (!(frame instanceof Uint8Array)) throw new Error('frames must be bytes')
    this.delivered.push({ from, to, frame: Buffer.from(frame).toString('utf8') })
    // Arrives a moment later, like a radio: never inside the sender's call.
    setImmediate(() => {
      if (!this.cut) target.receiveFrame(this.name, from, frame)
    })
  }

  /** Every end sees every other as a neighbor. */
  link() {
    this.cut = false
    for (const [a, pa] of this.ends) {
      for (const b of this.ends.keys()) if (a !== b) pa.neighborDiscovered(b, this.name)
    }
  }

  /** The link goes down: sends fail and every end loses its neighbors. */
  sever() {
    this.cut = true
    for (const [a, pa] of this.ends) {
      for (const b of this.ends.keys()) if (a !== b) pa.neighborLost(b, this.name)
    }
  }
}
