"""What every chat front door shares: tools, tool choices and response formats read into one plan
(chat_request.py), and answers read back into reasoning, text and tool calls (answer.py), for the HTTP
dialects and gRPC alike."""
