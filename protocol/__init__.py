"""Sans-IO codec for the RocketMQ 4.x remoting protocol: frames, commands, headers and stored records."""
