// Checks the Rust dependency graph against `deny.toml` with cargo-deny: licenses, bans (the
// unmaintained `rustls-pemfile` among them) and sources, offline. `--advisories` also fetches
// the RustSec advisory database and checks it; that needs the network, so the release workflow
// runs it and `npm test` does not.
//
// cargo-deny is not an npm or cargo dependency of the project: the first run installs the
// pinned version under ~/.cache/courier-tools (once per machine, a few minutes of compiling).
import { spawnSync } from 'node:child_process'
import { existsSync } from 'node:fs'
import { homedir } from 'node:os'
import { join } from 'node:path'

const VERSION = '0.20.2'
const ROOT = join(homedir(), '.cache', 'courier-tools')
const BIN = join(ROOT, 'bin', process.platform === 'win32' ? 'cargo-deny.exe' : 'cargo-deny')

function run(cmd, args) {
  const result = spawnSync(cmd, args, { stdio: 'inherit' })
  if (result.error) throw result.error
  return result.status ?? 1
}

function installedVersion() {
  if (!existsSync(BIN)) return null
  const result = spawnSync(BIN, ['--version'], { encoding: 'utf8' })
  return result.status === 0 ? result.stdout.trim().split(/\s+/)[1] : null
}

if (installedVersion() !== VERSION) {
  console.log(`cargo-deny ${VERSION} is not in ${ROOT}: installing it (once per machine)`)
  const status = run('cargo', ['install', 'cargo-deny', '--version', VERSION, '--locked', '--root', ROOT, '--target-dir', join(ROOT, 'build')])
  if (status !== 0) process.exit(status)
}

const advisories = process.argv.includes('--advisories')
const checks = advisories ? ['licenses', 'bans', 'sources', 'advisories'] : ['licenses', 'bans', 'sources']
const offline = advisories ? [] : ['--offline']
process.exit(run(BIN, ['--all-features', ...offline, 'check', ...checks]))
