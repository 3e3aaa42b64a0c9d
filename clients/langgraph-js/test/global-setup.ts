/** The suites talk to a real daemon: STRATAD_ADDRESS (as `new StratadSaver()` reads it). */
export default function setup(): void {
  if (!process.env.STRATAD_ADDRESS) {
    throw new Error(
      "set STRATAD_ADDRESS to a running daemon (`stratad serve` listens on 127.0.0.1:50051): " +
        "STRATAD_ADDRESS=127.0.0.1:50051 npm test",
    );
  }
}
