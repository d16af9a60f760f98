package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/ferrymq/ferrymq/producer"
	"github.com/ferrymq/ferrymq/protocol"
)

type sendOptions struct {
	body        string
	key         string
	props       []string
	reliability string
}

func newSendCommand(g *globalOptions) *cobra.Command {
	o := &sendOptions{}
	cmd := &cobra.Command{
		Use:   "send TOPIC",
		Short: "Send one message and print where it was stored",
		Args:  usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			rel, err := protocol.ParseReliability(o.reliability)
			if err != nil {
				return usageError{err}
			}
			props := map[string]string{}
			for _, kv := range o.props {
				k, v, ok := strings.Cut(kv, "=")
				if !ok {
					return usageError{fmt.Errorf("--prop %q: want key=value", kv)}
				}
				props[k] = v
			}
			p, err := producer.New(producer.MetaAddrs(g.addrs()...), producer.DeliveryTimeout(g.timeout), producer.RequestTimeout(g.timeout))
			if err != nil {
				return usageError{err}
			}
			defer p.Close()
			r, err := p.Send(cmd.Context(), &producer.Message{Topic: args[0], Key: o.key, Properties: props, Body: []byte(o.body), Reliability: rel})
			if err != nil {
				return err
			}
			return g.printer().print(r, []string{"ID", "TOPIC", "QUEUE", "QUEUE-OFFSET", "LOG-OFFSET", "GROUP", "BROKER"},
				[][]string{{r.ID, r.Topic, fmt.Sprint(r.Queue), fmt.Sprint(r.QueueOffset), fmt.Sprint(r.LogOffset), r.Group, r.Broker}})
		},
	}
	cmd.Flags().StringVar(&o.body, "body", "hello from ferryctl", "message body")
	cmd.Flags().StringVar(&o.key, "key", "", "message key (picks the queue)")
	cmd.Flags().StringSliceVar(&o.props, "prop", nil, "a property key=value (repeatable)")
	cmd.Flags().StringVar(&o.reliability, "reliability", "normal", "normal or high (answered after the slave has it)")
	return cmd
}
