module meshagent.local/pause

go 1.25.0
