// The processes of a crash run: each is a program (a Node script unless told otherwise) respawned on the same files after every
// SIGKILL. A process that exits without being killed or told to stop is recorded, never ignored.
import { spawn } from 'node:child_process'
import { closeSync, openSync } from 'node:fs'
import { createInterface } from 'node:readline'

/** Rejects with `what` when `promise` has not settled after `ms`. */
export function deadline(promise, ms, what) {
  let timer
  const expired = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: no answer within ${ms} ms`)), ms)
  })
  return Promise.race([promise, expired]).finally(() => clearTimeout(timer))
}

export class Supervised {
  /**
   * @param {string} name
   * @param {object} spec
   * @param {(incarnation: number) => string[]} spec.args  script and arguments for `node`, or
   *   for `spec.command`
   * @param {string} [spec.command]  the program to run instead of `node`
   * @param {(incarnation: number) => object} [spec.env]  extra environment
   * @param {string} spec.stderr  file that collects the stderr of every incarnation
   * @param {(line: string) => object | null} spec.ready  recognises the readiness line
   */
  constructor(name, { command = process.execPath, args, env = () => ({}), stderr, ready }) {
    this.name = name
    this.spec = { command, args, env, stderr, ready }
    this.incarnations = 0
    /** Our SIGKILLs: `{ at, pid }`, `at` the wall-clock time just before the signal. */
    this.kills = []
    /** Exits nobody asked for: `{ incarnation, code, signal }`. */
    this.unexpectedExits = []
    this.current = null
  }

  start() {
    const number = ++this.incarnations
    const stderr = openSync(this.spec.stderr, 'a')
    const child = spawn(this.spec.command, this.spec.args(number), {
      env: { ...process.env, ...this.spec.env(number) },
      stdio: ['pipe', 'pipe', stderr],
    })
    closeSync(stderr)
    const inc = { child, number, startedAt: Date.now(), readyAt: null, info: null, exitExpected: false, listeners: new Set() }
    inc.exited = new Promise((resolve) =>
      child.once('exit', (code, signal) => {
        if (!inc.exitExpected) this.unexpectedExits.push({ incarnation: number, code, signal })
        resolve({ code, signal })
      }),
    )
    inc.ready = new Promise((resolve, reject) => {
      inc.exited.then(({ code, signal }) => reject(new Error(`${this.name} #${number} exited (${signal ?? code}) before it was ready`)))
      inc.listeners.add((line) => {
        const info = this.spec.ready(line)
        if (info && inc.readyAt === null) {
          inc.readyAt = Date.now()
          inc.info = info
          resolve(info)
        }
      })
    })
    // A kill before readiness is part of the schedule; whoever waits for readiness sees the rejection.
    inc.ready.catch(() => {})
    createInterface({ input: child.stdout }).on('line', (line) => {
      for (const listener of [...inc.listeners]) listener(line)
    })
    // Writes to a child killed a moment ago fail with EPIPE; the kill is the point.
    child.stdin.on('error', () => {})
    this.current = inc
    return inc
  }

  /** Resolves with the first stdout line of the current incarnation that `predicate` accepts. */
  nextLine(predicate, ms, what) {
    const inc = this.current
    const found = new Promise((resolve) => {
      const listener = (line) => {
        if (!predicate(line)) return
        inc.listeners.delete(listener)
        resolve(line)
      }
      inc.listeners.add(listener)
    })
    return deadline(found, ms, `${this.name} ${what}`)
  }

  write(line) {
    this.current.child.stdin.write(`${line}\n`)
  }

  async kill() {
    const inc = this.current
    inc.exitExpected = true
    this.kills.push({ at: Date.now(), pid: inc.child.pid })
    inc.child.kill('SIGKILL')
    await inc.exited
  }

  /** Marks the coming exit as asked for (a `stop` command or SIGTERM). */
  expectExit() {
    this.current.exitExpected = true
    return this.current.exited
  }
}
