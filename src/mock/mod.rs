//! Built-in mock OpenAI-compatible model server with a simulated prefix cache. Never talks to the network except through the listener it is given.
