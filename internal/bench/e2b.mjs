// E2B's JS SDK against nook's E2B edge: create -> first output of
// `echo hi`, and commands.run('true') round trips. Prints one JSON line.
const { Sandbox } = await import(process.env.E2B_SDK_MODULE)
const rounds = Number(process.env.ROUNDS)
const execs = Number(process.env.EXECS)
const pause = ms => new Promise(r => setTimeout(r, ms))
const create = []
for (let i = 0; i < rounds; i++) {
  await pause(1000) // the warm pool refills, as for the Go SDK's rounds
  const t0 = performance.now()
  const sbx = await Sandbox.create('base')
  let first
  const got = new Promise(resolve => { first = resolve })
  await sbx.commands.run('echo hi', { onStdout: () => first(performance.now()) })
  create.push((await got) - t0)
  await sbx.kill()
}
const sbx = await Sandbox.create('base')
const run = []
try {
  for (let i = 0; i < execs; i++) {
    const t0 = performance.now()
    await sbx.commands.run('true')
    run.push(performance.now() - t0)
  }
} finally {
  await sbx.kill()
}
console.log(JSON.stringify({ create, run }))
